#include "server/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <array>
#include <deque>
#include <mutex>
#include <optional>

#include "base/log.h"

namespace v4::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

std::string HttpRequest::header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

const char* http_reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string error_json(const std::string& message, const char* type, const char* code) {
  // Minimal OpenAI-style error for transport-level failures (the API layer builds richer ones).
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped += '\\';
    escaped += c;
  }
  return fmt::format(R"({{"error":{{"message":"{}","type":"{}","param":null,"code":"{}"}}}})",
                     escaped, type, code);
}

}  // namespace

// One connection. Lives as long as an async operation or a ResponseWriter references it.
class Session : public std::enable_shared_from_this<Session>, public ResponseWriter {
 public:
  Session(tcp::socket socket, HttpServer::Impl* server);
  ~Session() override;
  void run();

  // ResponseWriter
  void respond(int status, std::string content_type, std::string body,
               std::vector<std::pair<std::string, std::string>> extra_headers) override;
  void start_stream(int status, std::string content_type) override;
  void write(std::string chunk) override;
  void end() override;
  bool closed() const override { return closed_.load(); }
  void on_close(std::function<void()> fn) override;
  void set_log_info(std::string info) override;
  void close_now();

 private:
  void do_read_header();
  void read_head();
  void on_header(beast::error_code ec);
  void on_body(beast::error_code ec);
  void dispatch();
  void start_probe();
  void on_probe(beast::error_code ec, size_t n);
  void enqueue(std::string bytes, bool last);
  void do_write();
  void on_write(beast::error_code ec);
  void response_finished();
  void linger_close();
  void drain();
  void fail(const char* what, beast::error_code ec);
  void transport_error(int status, const std::string& message);
  void log_access();
  // pending_responses bookkeeping (strand only): count this session's request once, from
  // dispatch until its response is written or the connection closes.
  void count_pending();
  void uncount_pending();

  beast::tcp_stream stream_;
  HttpServer::Impl* server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string remote_;

  // Per-request state (strand only).
  std::string method_, path_;
  bool keep_alive_ = true;
  bool http10_ = false;         // an HTTP/1.0 request: no chunked encoding in its response
  bool in_request_ = false;     // a request is dispatched and its response not finished
  bool streaming_ = false;
  bool probing_ = false;        // raw async_read_some in flight to detect disconnects
  bool read_after_probe_ = false;
  bool writing_ = false;
  bool response_done_ = false;  // the last bytes are queued
  bool peer_closed_ = false;    // the client closed while the last bytes were being written
  std::deque<std::pair<std::string, bool>> queue_;  // bytes, is_last
  int64_t queued_ = 0;     // bytes in queue_
  std::string out_;        // the write in flight
  std::unique_ptr<std::array<char, 16384>> discard_;  // lingering close
  int64_t drained_ = 0;
  bool out_last_ = false;  // it ends the response
  bool counted_ = false;   // counted in server_->pending (count_pending)
  int status_ = 0;
  int64_t n_requests_ = 0;
  int64_t bytes_out_ = 0;
  Clock::time_point t_start_;
  std::string log_info_;
  std::function<void()> on_close_;
  std::atomic<bool> closed_{false};
  std::mutex log_mu_;
};

struct HttpServer::Impl {
  HttpOptions opt;
  HttpHandler handler;
  // Declared before ioc: sessions destroyed with ioc's pending handlers still touch them.
  std::atomic<int64_t> open{0};
  std::atomic<int64_t> pending{0};  // dispatched requests whose response is not fully written
  std::atomic<bool> stopping{false};
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  int bound_port = 0;

  void do_accept() {
    acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket s) {
      if (stopping) return;
      if (ec) {
        // E.g. out of file descriptors: back off instead of spinning, and say so once a second.
        auto now = Clock::now();
        if (now - last_accept_warning > std::chrono::seconds(1)) {
          last_accept_warning = now;
          V4_LOG_WARN("accept failed: {} ({} connections open)", ec.message(), open.load());
        }
        accept_timer.expires_after(std::chrono::milliseconds(50));
        accept_timer.async_wait([this](beast::error_code) {
          if (!stopping) do_accept();
        });
        return;
      }
      std::make_shared<Session>(std::move(s), this)->run();
      do_accept();
    });
  }
  net::steady_timer accept_timer{ioc};
  Clock::time_point last_accept_warning{};
};

Session::Session(tcp::socket socket, HttpServer::Impl* server)
    : stream_(std::move(socket)), server_(server) {
  beast::error_code ec;
  auto ep = stream_.socket().remote_endpoint(ec);
  if (!ec) remote_ = fmt::format("{}:{}", ep.address().to_string(), ep.port());
  server_->open++;
}

Session::~Session() {
  uncount_pending();
  server_->open--;
}

void Session::count_pending() {
  if (counted_) return;
  counted_ = true;
  server_->pending++;
}

void Session::uncount_pending() {
  if (!counted_) return;
  counted_ = false;
  server_->pending--;
}

void Session::run() {
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read_header(); });
}

void Session::do_read_header() {
  parser_.emplace();
  parser_->header_limit(64 * 1024);
  parser_->body_limit(uint64_t(server_->opt.body_limit_bytes));
  in_request_ = false;
  if (n_requests_ > 0 && buffer_.size() == 0) {
    // Keep-alive: wait up to idle_timeout for the first byte of the next request, then give
    // the head header_timeout like a new connection.
    stream_.expires_after(server_->opt.idle_timeout);
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) {
        self->close_now();
        return;
      }
      self->buffer_.commit(n);
      self->read_head();
    });
    return;
  }
  read_head();
}

// Deadline for the whole head: a client dribbling bytes cannot keep the connection open.
void Session::read_head() {
  stream_.expires_after(server_->opt.header_timeout);
  http::async_read_header(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            self->on_header(ec);
                          });
}

void Session::on_header(beast::error_code ec) {
  if (ec == http::error::end_of_stream || ec == net::error::eof ||
      ec == net::error::connection_reset) {
    close_now();
    return;
  }
  if (ec == beast::error::timeout) {
    // Slow or idle client: close without a response (a slow-loris never completes its head).
    V4_LOG_DEBUG("closing {}: request head timed out", remote_);
    close_now();
    return;
  }
  if (ec == http::error::header_limit) {
    transport_error(431, "request headers too large");
    return;
  }
  if (ec == http::error::body_limit) {
    on_body(ec);
    return;
  }
  if (ec) {
    transport_error(400, std::string("malformed HTTP request: ") + ec.message());
    return;
  }
  t_start_ = Clock::now();
  if (parser_->content_length() && *parser_->content_length() > uint64_t(server_->opt.body_limit_bytes)) {
    method_ = std::string(parser_->get().method_string());
    path_ = std::string(parser_->get().target());
    transport_error(413, fmt::format("request body of {} bytes exceeds the limit of {} bytes",
                                     *parser_->content_length(), server_->opt.body_limit_bytes));
    return;
  }
  if (parser_->is_done()) {
    on_body({});
    return;
  }
  stream_.expires_after(server_->opt.body_timeout);
  auto read_body = [self = shared_from_this()] {
    http::async_read(self->stream_, self->buffer_, *self->parser_,
                     [self](beast::error_code e, size_t) { self->on_body(e); });
  };
  // "Expect: 100-continue" (curl sends it for bodies over 1 MiB, then waits 1 s for the interim
  // answer before sending anyway): say go ahead now. The body is not here yet, and an oversize
  // one was answered with 413 above (RFC 9110 §10.1.1).
  const auto& head = parser_->get();
  if (head.version() == 11 && buffer_.size() == 0 &&
      beast::iequals(head[http::field::expect], "100-continue")) {
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    net::async_write(stream_, net::buffer(kContinue),
                     [self = shared_from_this(), read_body](beast::error_code e, size_t) {
                       if (e) {
                         self->close_now();
                         return;
                       }
                       read_body();
                     });
    return;
  }
  read_body();
}

void Session::on_body(beast::error_code ec) {
  if (ec == http::error::body_limit) {
    method_ = std::string(parser_->get().method_string());
    path_ = std::string(parser_->get().target());
    transport_error(413, fmt::format("request body exceeds the limit of {} bytes",
                                     server_->opt.body_limit_bytes));
    return;
  }
  if (ec == beast::error::timeout) {
    V4_LOG_DEBUG("closing {}: request body timed out", remote_);
    close_now();
    return;
  }
  if (ec) {
    if (ec == net::error::eof || ec == http::error::end_of_stream ||
        ec == net::error::connection_reset || ec == http::error::partial_message) {
      close_now();
      return;
    }
    transport_error(400, std::string("malformed HTTP request: ") + ec.message());
    return;
  }
  stream_.expires_never();
  dispatch();
}

namespace {
// RFC 9112 §3.2.2: a server must accept the absolute-form (`http://host:port/path?q`), which
// proxies send; it routes by the path and query, as for the origin-form. Other targets unchanged.
std::string origin_form(std::string_view target) {
  size_t i = 0;
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  if (target.empty() || !alpha(target[0])) return std::string(target);
  while (i < target.size() && (alpha(target[i]) || (target[i] >= '0' && target[i] <= '9') ||
                               target[i] == '+' || target[i] == '-' || target[i] == '.'))
    ++i;
  if (target.substr(i, 3) != "://") return std::string(target);
  size_t rest = target.find_first_of("/?#", i + 3);  // end of the authority
  if (rest == std::string_view::npos) return "/";
  std::string out(target.substr(rest));
  if (out[0] != '/') out.insert(0, "/");
  return out;
}
}  // namespace

void Session::dispatch() {
  auto msg = parser_->release();
  HttpRequest req;
  req.method = std::string(msg.method_string());
  req.target = origin_form(std::string_view(msg.target().data(), msg.target().size()));
  auto q = req.target.find('?');
  req.path = q == std::string::npos ? req.target : req.target.substr(0, q);
  for (auto& f : msg) {
    auto nm = f.name_string();
    req.headers[lower(std::string_view(nm.data(), nm.size()))] = std::string(f.value());
  }
  req.body = std::move(msg.body());
  req.remote = remote_;
  keep_alive_ = msg.keep_alive();
  http10_ = msg.version() < 11;
  method_ = req.method;
  path_ = req.path;
  status_ = 0;
  bytes_out_ = 0;
  log_info_.clear();
  streaming_ = false;
  response_done_ = false;
  in_request_ = true;
  count_pending();
  ++n_requests_;
  start_probe();
  try {
    server_->handler(std::move(req), shared_from_this());
  } catch (const std::exception& e) {
    V4_LOG_ERROR("handler threw: {}", e.what());
    respond(500, "application/json", error_json("internal error", "server_error", "internal_error"), {});
  }
}

// While a response is pending, keep one raw read on the socket: it completes with an error when
// the client disconnects (-> on_close callback, e.g. Engine::cancel), or with pipelined bytes
// that are kept for the next request.
void Session::start_probe() {
  if (probing_ || closed_) return;
  if (buffer_.size() > 64 * 1024) return;  // a client pipelining this much can wait
  probing_ = true;
  stream_.socket().async_read_some(
      buffer_.prepare(4096),
      [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_probe(ec, n); });
}

void Session::on_probe(beast::error_code ec, size_t n) {
  probing_ = false;
  if (!ec) {
    buffer_.commit(n);
  }
  if (read_after_probe_) {
    read_after_probe_ = false;
    if (ec && ec != net::error::operation_aborted) {
      close_now();
      return;
    }
    do_read_header();
    return;
  }
  if (ec) {
    if (ec == net::error::operation_aborted) return;
    if (response_done_ && writing_) {
      // The whole answer is on its way (a client may read it and close before our write's
      // completion runs): not a disconnect. on_write finishes the response, then closes.
      peer_closed_ = true;
      return;
    }
    fail("client disconnected", ec);
    return;
  }
  if (in_request_) start_probe();
}

void Session::on_close(std::function<void()> fn) {
  net::dispatch(stream_.get_executor(), [self = shared_from_this(), fn = std::move(fn)]() mutable {
    if (self->closed_) {
      fn();
    } else if (self->in_request_) {
      self->on_close_ = std::move(fn);
    }
  });
}

void Session::set_log_info(std::string info) {
  std::lock_guard<std::mutex> lk(log_mu_);
  log_info_ = std::move(info);
}

void Session::respond(int status, std::string content_type, std::string body,
                      std::vector<std::pair<std::string, std::string>> extra_headers) {
  net::dispatch(stream_.get_executor(), [self = shared_from_this(), status,
                                         ct = std::move(content_type), body = std::move(body),
                                         extra = std::move(extra_headers)]() mutable {
    if (self->closed_ || !self->in_request_ || self->response_done_ || self->streaming_) return;
    self->status_ = status;
    std::string head = fmt::format("HTTP/1.1 {} {}\r\nServer: v4serve\r\nContent-Type: {}\r\n"
                                   "Content-Length: {}\r\n",
                                   status, http_reason(status), ct, body.size());
    for (auto& [k, v] : extra) head += k + ": " + v + "\r\n";
    // HTTP/1.0 closes after each response unless the server says it keeps the connection
    // (RFC 9112 §9.3 / Appendix C.2.2): an HTTP/1.0 request that asked for keep-alive is told so.
    if (!self->keep_alive_)
      head += "Connection: close\r\n";
    else if (self->http10_)
      head += "Connection: keep-alive\r\n";
    head += "\r\n";
    if (self->method_ != "HEAD") head += body;
    self->enqueue(std::move(head), true);
  });
}

void Session::start_stream(int status, std::string content_type) {
  net::dispatch(stream_.get_executor(), [self = shared_from_this(), status,
                                         ct = std::move(content_type)] {
    if (self->closed_ || !self->in_request_ || self->response_done_ || self->streaming_) return;
    self->status_ = status;
    self->streaming_ = true;
    // HTTP/1.0 has no chunked encoding (RFC 9112 §6.1: not to be sent to a 1.0 request): the
    // body is written as is and ends when the connection closes.
    if (self->http10_) self->keep_alive_ = false;
    std::string head = fmt::format("HTTP/1.1 {} {}\r\nServer: v4serve\r\nContent-Type: {}\r\n"
                                   "Cache-Control: no-cache\r\n{}",
                                   status, http_reason(status), ct,
                                   self->http10_ ? "" : "Transfer-Encoding: chunked\r\n");
    if (!self->keep_alive_) head += "Connection: close\r\n";
    head += "\r\n";
    self->enqueue(std::move(head), false);
  });
}

void Session::write(std::string chunk) {
  if (chunk.empty()) return;
  net::dispatch(stream_.get_executor(), [self = shared_from_this(), chunk = std::move(chunk)] {
    if (self->closed_ || !self->streaming_ || self->response_done_) return;
    if (self->http10_) {
      self->enqueue(std::move(chunk), false);
      return;
    }
    std::string framed = fmt::format("{:x}\r\n", chunk.size());
    framed += chunk;
    framed += "\r\n";
    self->enqueue(std::move(framed), false);
  });
}

void Session::end() {
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
    if (self->closed_ || !self->streaming_ || self->response_done_) return;
    self->enqueue(self->http10_ ? "" : "0\r\n\r\n", true);
  });
}

// Largest write that coalesces queued pieces: the write deadline then measures progress (a client
// that reads ≥ kMaxWriteBytes per write_timeout is never cut), not the time to drain everything
// queued behind a slow reader.
constexpr size_t kMaxWriteBytes = size_t(1) << 20;

void Session::enqueue(std::string bytes, bool last) {
  bytes_out_ += int64_t(bytes.size());
  if (last) response_done_ = true;
  queued_ += int64_t(bytes.size());
  queue_.emplace_back(std::move(bytes), last);
  // Back-pressure bound: a stream whose client reads slower than it is produced (or not at all)
  // would queue without limit; past max_stream_queue_bytes it is ended like a disconnect (the
  // engine request is cancelled through on_close). A non-streaming response is one piece and is
  // never cut here.
  if (streaming_ && !last && queued_ > server_->opt.max_stream_queue_bytes) {
    fail("client not reading its stream (queue limit reached)", net::error::no_buffer_space);
    return;
  }
  if (!writing_) do_write();
}

void Session::do_write() {
  if (queue_.empty() || closed_) return;
  writing_ = true;
  // Coalesce queued pieces (up to kMaxWriteBytes, at least one) into one write; `out_` stays
  // untouched until it completes.
  out_.clear();
  out_last_ = false;
  while (!queue_.empty() &&
         (out_.empty() || out_.size() + queue_.front().first.size() <= kMaxWriteBytes)) {
    out_ += queue_.front().first;
    out_last_ = out_last_ || queue_.front().second;
    queued_ -= int64_t(queue_.front().first.size());
    queue_.pop_front();
  }
  stream_.expires_after(server_->opt.write_timeout);
  net::async_write(stream_, net::buffer(out_),
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
}

void Session::on_write(beast::error_code ec) {
  writing_ = false;
  if (ec) {
    fail("write failed", ec);
    return;
  }
  stream_.expires_never();
  if (out_last_) {
    response_finished();
    return;
  }
  if (!queue_.empty()) do_write();
}

void Session::response_finished() {
  uncount_pending();
  log_access();
  in_request_ = false;
  streaming_ = false;
  on_close_ = nullptr;
  if (!keep_alive_ || server_->stopping || peer_closed_) {
    linger_close();
    return;
  }
  if (probing_) {
    read_after_probe_ = true;
    beast::error_code ec;
    stream_.socket().cancel(ec);
    return;
  }
  do_read_header();
}

// Half-close, then read and discard what the client still sends (e.g. the rest of an oversize
// body) for a short while, so it can read our answer instead of getting a connection reset.
void Session::linger_close() {
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  if (ec || probing_ || server_->stopping) {
    close_now();
    return;
  }
  stream_.expires_after(std::chrono::seconds(5));
  drain();
}

void Session::drain() {
  if (!discard_) discard_ = std::make_unique<std::array<char, 16384>>();
  stream_.async_read_some(net::buffer(*discard_), [self = shared_from_this()](beast::error_code ec, size_t n) {
    self->drained_ += int64_t(n);
    if (ec || self->drained_ > (int64_t(256) << 20)) {
      self->close_now();
      return;
    }
    self->drain();
  });
}

void Session::log_access() {
  if (!server_->opt.access_log) return;
  double ms = std::chrono::duration<double, std::milli>(Clock::now() - t_start_).count();
  std::string info;
  {
    std::lock_guard<std::mutex> lk(log_mu_);
    info = log_info_;
  }
  V4_LOG_INFO("{} \"{} {}\" {} {}B {:.1f}ms{}{}", remote_, method_, log_escape(path_), status_,
              bytes_out_, ms, info.empty() ? "" : " ", log_escape(info));
}

void Session::fail(const char* what, beast::error_code ec) {
  if (closed_) return;
  if (in_request_) {
    // A response that did not end counts as 499 (client closed request), also when its head had
    // gone out with 200 (a stream): the same status /metrics records for it.
    if (!response_done_ || !status_) status_ = 499;
    V4_LOG_INFO("{} \"{} {}\" {}: {} ({})", remote_, method_, log_escape(path_), status_, what,
                ec.message());
  }
  close_now();
}

void Session::close_now() {
  if (closed_.exchange(true)) return;
  uncount_pending();
  beast::error_code ec;
  stream_.socket().close(ec);
  queue_.clear();
  queued_ = 0;
  auto fn = std::move(on_close_);
  on_close_ = nullptr;
  if (fn && in_request_ && !response_done_) fn();
}

void Session::transport_error(int status, const std::string& message) {
  keep_alive_ = false;
  in_request_ = true;
  if (t_start_ == Clock::time_point{}) t_start_ = Clock::now();
  const char* type = status == 413 ? "request_too_large" : "invalid_request_error";
  const char* code = status == 413 ? "request_too_large" : status == 431 ? "headers_too_large" : "bad_http_request";
  std::string body = error_json(message, type, code);
  respond(status, "application/json", std::move(body), {});
}

HttpServer::HttpServer(HttpOptions options, HttpHandler handler) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  impl_->handler = std::move(handler);
}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::start() {
  auto& I = *impl_;
  beast::error_code ec;
  auto addr = net::ip::make_address(I.opt.host, ec);
  if (ec) return make_error(ErrorCode::kInvalidArgument, "bad --host '{}': {}", I.opt.host, ec.message());
  tcp::endpoint ep(addr, uint16_t(I.opt.port));
  I.acceptor.emplace(I.ioc);
  I.acceptor->open(ep.protocol(), ec);
  if (!ec) I.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) I.acceptor->bind(ep, ec);
  if (!ec) I.acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return make_error(ErrorCode::kIoError, "cannot listen on {}:{}: {}", I.opt.host, I.opt.port,
                      ec.message());
  }
  I.bound_port = I.acceptor->local_endpoint().port();
  I.work.emplace(net::make_work_guard(I.ioc));
  I.do_accept();
  for (int i = 0; i < std::max(1, I.opt.n_threads); ++i) {
    I.threads.emplace_back([&I] { I.ioc.run(); });
  }
  return Status::Ok();
}

int HttpServer::port() const { return impl_->bound_port; }

int64_t HttpServer::open_connections() const { return impl_->open.load(); }

int64_t HttpServer::pending_responses() const { return impl_->pending.load(); }

bool HttpServer::wait_responses(std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  while (impl_->pending.load() > 0) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

void HttpServer::stop() {
  auto& I = *impl_;
  if (I.threads.empty()) return;
  I.stopping = true;
  net::post(I.ioc, [&I] {
    beast::error_code ec;
    if (I.acceptor) I.acceptor->close(ec);
  });
  I.work.reset();
  I.ioc.stop();
  for (auto& t : I.threads) t.join();
  I.threads.clear();
}

}  // namespace v4::server
