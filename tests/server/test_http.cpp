// HttpServer transport tests over real loopback sockets: keep-alive, chunked streaming from
// another thread, body limit (413), slow-loris close, disconnect callback, 400 on garbage.
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <thread>

#include "server/http_server.h"

using namespace v4::server;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;

namespace {

struct Client {
  net::io_context ioc;
  tcp::socket s{ioc};
  explicit Client(int port) { s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), uint16_t(port))); }
  void send(const std::string& data) { net::write(s, net::buffer(data)); }
  // Reads until the peer closes or `until` appears in the data or the timeout passes.
  std::string read(const std::string& until = "", std::chrono::milliseconds timeout = 5000ms,
                   bool* closed = nullptr) {
    std::string out;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    s.non_blocking(true);
    char buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      boost::system::error_code ec;
      size_t n = s.read_some(net::buffer(buf), ec);
      if (ec == net::error::would_block) {
        if (!until.empty() && out.find(until) != std::string::npos) break;
        std::this_thread::sleep_for(2ms);
        continue;
      }
      if (ec) {
        if (closed) *closed = true;
        break;
      }
      out.append(buf, n);
    }
    s.non_blocking(false);
    return out;
  }
};

// Decodes a chunked body (after the head).
std::string dechunk(const std::string& body) {
  std::string out;
  size_t p = 0;
  while (p < body.size()) {
    size_t e = body.find("\r\n", p);
    if (e == std::string::npos) break;
    size_t n = std::stoul(body.substr(p, e - p), nullptr, 16);
    if (n == 0) break;
    out += body.substr(e + 2, n);
    p = e + 2 + n + 2;
  }
  return out;
}

class HttpTest : public ::testing::Test {
 protected:
  void start(HttpHandler h, HttpOptions o = {}) {
    o.port = 0;
    o.access_log = false;
    server_ = std::make_unique<HttpServer>(o, std::move(h));
    auto st = server_->start();
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  void TearDown() override {
    if (server_) server_->stop();
  }
  // A fresh connection still gets its 200 "ok" for `request` (the server kept serving).
  void expect_still_serving(const std::string& request) {
    Client ok(server_->port());
    ok.send(request);
    EXPECT_NE(ok.read("ok").find("200 OK"), std::string::npos) << request;
  }
  std::unique_ptr<HttpServer> server_;
};

}  // namespace

TEST_F(HttpTest, KeepAliveAndHeaders) {
  start([](HttpRequest r, std::shared_ptr<ResponseWriter> w) {
    w->respond(200, "text/plain", r.method + " " + r.path + " " + r.header("x-thing") + " " + r.body);
  });
  Client c(server_->port());
  c.send("POST /a/b?q=1 HTTP/1.1\r\nHost: x\r\nX-Thing: yes\r\nContent-Length: 3\r\n\r\nabc");
  std::string r1 = c.read("abc");
  EXPECT_EQ(r1.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r1;
  EXPECT_NE(r1.find("Content-Length: 17\r\n"), std::string::npos) << r1;
  EXPECT_NE(r1.find("POST /a/b yes abc"), std::string::npos) << r1;
  // Second request on the same connection.
  c.send("GET /c HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string r2 = c.read("GET /c");
  EXPECT_NE(r2.find("GET /c  "), std::string::npos) << r2;
}

TEST_F(HttpTest, ChunkedStreamFromAnotherThread) {
  std::vector<std::thread> threads;
  std::mutex mu;
  start([&](HttpRequest, std::shared_ptr<ResponseWriter> w) {
    std::lock_guard<std::mutex> lk(mu);
    threads.emplace_back([w] {
      w->start_stream(200, "text/event-stream");
      for (int i = 0; i < 3; ++i) {
        w->write("data: " + std::to_string(i) + "\n\n");
        std::this_thread::sleep_for(10ms);
      }
      w->write("data: [DONE]\n\n");
      w->end();
    });
  });
  Client c(server_->port());
  c.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string r = c.read("0\r\n\r\n");
  EXPECT_NE(r.find("Transfer-Encoding: chunked\r\n"), std::string::npos) << r;
  EXPECT_NE(r.find("Content-Type: text/event-stream\r\n"), std::string::npos) << r;
  std::string body = dechunk(r.substr(r.find("\r\n\r\n") + 4));
  EXPECT_EQ(body, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n");
  // The connection is still usable afterwards.
  c.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string r2 = c.read("0\r\n\r\n");
  EXPECT_NE(r2.find("data: [DONE]"), std::string::npos);
  std::lock_guard<std::mutex> lk(mu);
  for (auto& t : threads) t.join();
}

// An HTTP/1.0 request cannot read chunked encoding: its stream comes without
// Transfer-Encoding, unframed, and ends with the connection closing.
TEST_F(HttpTest, Http10StreamIsNotChunked) {
  std::vector<std::thread> threads;
  std::mutex mu;
  start([&](HttpRequest, std::shared_ptr<ResponseWriter> w) {
    std::lock_guard<std::mutex> lk(mu);
    threads.emplace_back([w] {
      w->start_stream(200, "text/event-stream");
      w->write("data: 0\n\n");
      w->write("data: [DONE]\n\n");
      w->end();
    });
  });
  for (const char* conn : {"", "Connection: keep-alive\r\n"}) {
    Client c(server_->port());
    c.send(std::string("GET /s HTTP/1.0\r\n") + conn + "\r\n");
    bool closed = false;
    std::string r = c.read("", 3000ms, &closed);
    EXPECT_TRUE(closed) << r;
    EXPECT_EQ(r.find("Transfer-Encoding"), std::string::npos) << r;
    EXPECT_NE(r.find("Connection: close\r\n"), std::string::npos) << r;
    EXPECT_EQ(r.substr(r.find("\r\n\r\n") + 4), "data: 0\n\ndata: [DONE]\n\n") << r;
  }
  std::lock_guard<std::mutex> lk(mu);
  for (auto& t : threads) t.join();
}

// HTTP/1.0 closes after a response unless the server announces that it keeps the connection: a
// 1.0 request with `Connection: keep-alive` gets `Connection: keep-alive` back (it got no
// Connection header, so the client closed) and the connection serves the next request; a 1.0
// request without it still gets `Connection: close` and the close; HTTP/1.1 is unchanged.
TEST_F(HttpTest, Http10KeepAliveIsAnnounced) {
  start([](HttpRequest r, std::shared_ptr<ResponseWriter> w) {
    w->respond(200, "text/plain", "ok " + r.path);
  });
  for (const char* conn : {"Connection: keep-alive\r\n", "Connection: Keep-Alive\r\n"}) {
    Client c(server_->port());
    c.send(std::string("GET /a HTTP/1.0\r\n") + conn + "\r\n");
    std::string r1 = c.read("ok /a");
    EXPECT_EQ(r1.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r1;
    EXPECT_NE(r1.find("Connection: keep-alive\r\n"), std::string::npos) << r1;
    EXPECT_EQ(r1.find("Connection: close"), std::string::npos) << r1;
    c.send(std::string("GET /b HTTP/1.0\r\n") + conn + "\r\n");
    bool closed = false;
    std::string r2 = c.read("ok /b", 3000ms, &closed);
    EXPECT_FALSE(closed) << r2;
    EXPECT_NE(r2.find("ok /b"), std::string::npos) << r2;
    EXPECT_NE(r2.find("Connection: keep-alive\r\n"), std::string::npos) << r2;
  }
  {
    Client c(server_->port());
    c.send("GET /a HTTP/1.0\r\n\r\n");
    bool closed = false;
    std::string r = c.read("", 3000ms, &closed);
    EXPECT_TRUE(closed) << r;
    EXPECT_NE(r.find("Connection: close\r\n"), std::string::npos) << r;
    EXPECT_EQ(r.find("keep-alive"), std::string::npos) << r;
  }
  {
    Client c(server_->port());
    c.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
    std::string r = c.read("ok /a");
    EXPECT_EQ(r.find("Connection:"), std::string::npos) << r;
  }
}

TEST_F(HttpTest, OversizeBodyGets413) {
  std::atomic<int> calls{0};
  HttpOptions o;
  o.body_limit_bytes = 1000;
  start([&](HttpRequest, std::shared_ptr<ResponseWriter> w) {
    calls++;
    w->respond(200, "text/plain", "ok");
  }, o);
  {
    Client c(server_->port());
    c.send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + std::string(5000, 'a'));
    bool closed = false;
    std::string r = c.read("", 3000ms, &closed);
    EXPECT_EQ(r.rfind("HTTP/1.1 413", 0), 0u) << r;
    EXPECT_NE(r.find("\"error\""), std::string::npos) << r;
    EXPECT_TRUE(closed);
  }
  {
    // Chunked upload without a Content-Length also hits the limit.
    Client c(server_->port());
    std::string chunk(600, 'b');
    c.send("POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n258\r\n" + chunk + "\r\n258\r\n" + chunk + "\r\n0\r\n\r\n");
    std::string r = c.read("", 3000ms);
    EXPECT_EQ(r.rfind("HTTP/1.1 413", 0), 0u) << r;
  }
  EXPECT_EQ(calls.load(), 0);
  expect_still_serving("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi");
}

// "Expect: 100-continue" (curl sends it for bodies over 1 MiB and waits up to 1 s): the server
// answers "100 Continue" at once, then the final response once the body has arrived; an oversize
// body gets its 413 instead of the 100, and a request that sent its body already gets no 100.
TEST_F(HttpTest, ExpectContinueGets100BeforeTheBody) {
  HttpOptions o;
  o.body_limit_bytes = 1000;
  start([](HttpRequest r, std::shared_ptr<ResponseWriter> w) { w->respond(200, "text/plain", "got " + r.body); }, o);
  {
    Client c(server_->port());
    c.send("POST /x HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue\r\nContent-Length: 5\r\n\r\n");
    std::string interim = c.read("\r\n\r\n", 2000ms);
    EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
    c.send("hello");
    std::string r = c.read("got hello");
    EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
    EXPECT_NE(r.find("got hello"), std::string::npos) << r;
  }
  {
    Client c(server_->port());
    c.send("POST /x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n");
    std::string r = c.read("", 2000ms);
    EXPECT_EQ(r.rfind("HTTP/1.1 413", 0), 0u) << r;
    EXPECT_EQ(r.find("100 Continue"), std::string::npos) << r;
  }
  {
    Client c(server_->port());
    c.send("POST /x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi");
    std::string r = c.read("got hi");
    EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  }
}

TEST_F(HttpTest, SlowLorisIsClosed) {
  HttpOptions o;
  o.header_timeout = 500ms;
  start([](HttpRequest, std::shared_ptr<ResponseWriter> w) { w->respond(200, "text/plain", "ok"); }, o);
  Client c(server_->port());
  const std::string head = "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
  auto t0 = std::chrono::steady_clock::now();
  bool closed = false;
  for (char ch : head) {
    boost::system::error_code ec;
    net::write(c.s, net::buffer(&ch, 1), ec);
    if (ec) {
      closed = true;
      break;
    }
    std::this_thread::sleep_for(50ms);
    if (std::chrono::steady_clock::now() - t0 > 3s) break;
  }
  if (!closed) {
    std::string r = c.read("", 1000ms, &closed);
    EXPECT_EQ(r.find("200 OK"), std::string::npos) << r;
  }
  EXPECT_TRUE(closed);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  expect_still_serving("GET / HTTP/1.1\r\nHost: x\r\n\r\n");  // others are still served
}

TEST_F(HttpTest, SlowLorisAfterKeepAliveRequestIsClosed) {
  HttpOptions o;
  o.header_timeout = 500ms;
  o.idle_timeout = 30s;  // idle keep-alive may wait long, a dribbled head may not
  start([](HttpRequest, std::shared_ptr<ResponseWriter> w) { w->respond(200, "text/plain", "ok"); }, o);
  Client c(server_->port());
  c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_NE(c.read("ok").find("200 OK"), std::string::npos);
  std::this_thread::sleep_for(700ms);  // idle longer than header_timeout: still open
  const std::string head = "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
  auto t0 = std::chrono::steady_clock::now();
  bool closed = false;
  for (char ch : head) {
    boost::system::error_code ec;
    net::write(c.s, net::buffer(&ch, 1), ec);
    if (ec) {
      closed = true;
      break;
    }
    std::this_thread::sleep_for(50ms);
    if (std::chrono::steady_clock::now() - t0 > 3s) break;
  }
  if (!closed) c.read("", 1000ms, &closed);
  EXPECT_TRUE(closed);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

TEST_F(HttpTest, DisconnectRunsOnClose) {
  std::atomic<int> closed{0};
  std::shared_ptr<ResponseWriter> held;
  std::mutex mu;
  start([&](HttpRequest, std::shared_ptr<ResponseWriter> w) {
    w->on_close([&] { closed++; });
    w->start_stream(200, "text/event-stream");
    w->write("data: 1\n\n");
    std::lock_guard<std::mutex> lk(mu);
    held = w;  // never ends: like a long generation
  });
  {
    Client c(server_->port());
    c.send("POST /g HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    c.read("data: 1");
  }  // client hangs up
  for (int i = 0; i < 200 && closed.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(closed.load(), 1);
  std::lock_guard<std::mutex> lk(mu);
  ASSERT_TRUE(held);
  EXPECT_TRUE(held->closed());
  held->write("data: 2\n\n");  // ignored, no crash
  held->end();
  held.reset();
}

// RFC 9112 §3.2.2: an absolute-form target routes by its path and query (it used to be a 404,
// routed by the whole URL).
TEST_F(HttpTest, AbsoluteFormTargetRoutesByPath) {
  start([](HttpRequest r, std::shared_ptr<ResponseWriter> w) {
    if (r.path != "/health" && r.path != "/") return w->respond(404, "text/plain", "no " + r.path);
    w->respond(200, "text/plain", "path=" + r.path + " target=" + r.target + ";");
  });
  const std::string port = std::to_string(server_->port());
  Client c(server_->port());
  c.send("GET http://127.0.0.1:" + port + "/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  std::string r = c.read(";");
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("path=/health target=/health;"), std::string::npos) << r;
  c.send("GET HTTPS://example.com/health?x=1 HTTP/1.1\r\nHost: example.com\r\n\r\n");
  r = c.read("x=1;");
  EXPECT_NE(r.find("path=/health target=/health?x=1;"), std::string::npos) << r;
  c.send("GET http://127.0.0.1:" + port + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  r = c.read("target=/;");
  EXPECT_NE(r.find("path=/ target=/;"), std::string::npos) << r;
  // The origin-form is unchanged.
  c.send("GET /health?y HTTP/1.1\r\nHost: x\r\n\r\n");
  r = c.read("y;");
  EXPECT_NE(r.find("path=/health target=/health?y;"), std::string::npos) << r;
}

TEST_F(HttpTest, GarbageGets400) {
  start([](HttpRequest, std::shared_ptr<ResponseWriter> w) { w->respond(200, "text/plain", "ok"); });
  Client c(server_->port());
  c.send("THIS IS NOT HTTP\r\n\r\n");
  std::string r = c.read("", 2000ms);
  EXPECT_EQ(r.rfind("HTTP/1.1 400", 0), 0u) << r;
}

TEST_F(HttpTest, ManyConcurrentStreams) {
  // 300 open streams served by 2 I/O threads, all held open at once.
  std::vector<std::shared_ptr<ResponseWriter>> writers;
  std::mutex mu;
  start([&](HttpRequest, std::shared_ptr<ResponseWriter> w) {
    w->start_stream(200, "text/event-stream");
    std::lock_guard<std::mutex> lk(mu);
    writers.push_back(w);
  });
  const int n = 300;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < n; ++i) {
    clients.push_back(std::make_unique<Client>(server_->port()));
    clients.back()->send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n");
  }
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (int(writers.size()) == n) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    ASSERT_EQ(int(writers.size()), n);
    for (auto& w : writers) {
      w->write("data: x\n\n");
      w->end();
    }
    writers.clear();
  }
  EXPECT_GE(server_->open_connections(), n);
  for (auto& c : clients) EXPECT_NE(c->read("0\r\n\r\n").find("data: x"), std::string::npos);
}

// Back-pressure bound: a stream whose client does not read is ended like a disconnect once more
// than max_stream_queue_bytes are queued behind the socket (the writer sees closed() and its
// on_close callback runs, so the engine request would be cancelled); other clients are served.
TEST_F(HttpTest, UnreadStreamIsEndedAtTheQueueLimit) {
  HttpOptions o;
  o.max_stream_queue_bytes = 1 << 20;
  std::atomic<bool> callback{false}, saw_closed{false};
  std::atomic<int64_t> written{0};
  std::vector<std::thread> threads;
  std::mutex mu;
  start([&](HttpRequest r, std::shared_ptr<ResponseWriter> w) {
    if (r.path != "/s") {
      w->respond(200, "text/plain", "ok");
      return;
    }
    w->on_close([&] { callback = true; });
    std::lock_guard<std::mutex> lk(mu);
    threads.emplace_back([&, w] {
      w->start_stream(200, "text/event-stream");
      const std::string piece = "data: " + std::string(16384, 'x') + "\n\n";
      for (int i = 0; i < 4096 && !w->closed(); ++i) {  // up to 64 MiB
        w->write(piece);
        written += int64_t(piece.size());
        if (i % 64 == 63) std::this_thread::sleep_for(1ms);
      }
      saw_closed = w->closed();
      w->end();
    });
  }, o);
  Client c(server_->port());
  c.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n");  // and never read
  for (int i = 0; i < 1000 && !saw_closed; ++i) std::this_thread::sleep_for(10ms);
  {
    std::lock_guard<std::mutex> lk(mu);
    for (auto& t : threads) t.join();
  }
  EXPECT_TRUE(saw_closed) << written.load() << " bytes written, never closed";
  EXPECT_TRUE(callback.load());
  EXPECT_LT(written.load(), int64_t(48) << 20);  // cut long before the writer's 64 MiB
  expect_still_serving("GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
}

// A client that reads steadily but slower than its stream is produced gets all of it: each write
// coalesces at most 1 MiB, so the write deadline measures progress, not the time to drain
// everything queued behind it (one coalesced write of all of it used to hit the deadline).
TEST_F(HttpTest, SlowSteadyReaderGetsTheWholeStream) {
  HttpOptions o;
  o.write_timeout = 1000ms;
  std::vector<std::thread> threads;
  std::mutex mu;
  constexpr int kPieces = 384;  // 24 MiB of 64 KiB events
  start([&](HttpRequest, std::shared_ptr<ResponseWriter> w) {
    std::lock_guard<std::mutex> lk(mu);
    threads.emplace_back([w] {
      w->start_stream(200, "text/event-stream");
      const std::string piece = "data: " + std::string(65536 - 8, 'y') + "\n\n";
      for (int i = 0; i < kPieces && !w->closed(); ++i) w->write(piece);
      w->end();
    });
  }, o);
  Client c(server_->port());
  c.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string got;
  std::vector<char> buf(32768);
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    boost::system::error_code ec;
    const size_t n = c.s.read_some(net::buffer(buf.data(), buf.size()), ec);
    if (ec) break;
    got.append(buf.data(), n);
    if (got.size() > 5 && got.compare(got.size() - 5, 5, "0\r\n\r\n") == 0) break;
    std::this_thread::sleep_for(5ms);  // ≤ ~6 MB/s: the 24 MiB take seconds, 1 MiB well < 1 s
    if (std::chrono::steady_clock::now() - t0 > 60s) break;
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    for (auto& t : threads) t.join();
  }
  const size_t body = got.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos);
  EXPECT_EQ(dechunk(got.substr(body + 4)).size(), size_t(kPieces) * 65536) << got.size();
}
