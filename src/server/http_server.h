// Asynchronous HTTP/1.1 server on Boost.Beast/Asio: a small io_context thread pool serves any
// number of keep-alive connections and long-lived SSE streams without a thread each.
// Guards: header deadline (slow-loris clients are closed), body deadline, body size limit (413),
// write deadline per chunk, client-disconnect detection while a response is pending.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"

namespace v4::server {

/// A parsed request. Header names are lowercased.
struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // raw request target, e.g. "/v1/models?x=1"
  std::string path;    // target without the query string
  std::map<std::string, std::string> headers;
  std::string body;
  std::string remote;  // "ip:port" of the client
  /// Header value by lowercase name, or "" when absent.
  std::string header(const std::string& name) const;
};

/// Sends the answer to one request; thread-safe (engine threads may call it), every call is
/// posted to the connection's strand. Either `respond` once, or `start_stream` + `write`* +
/// `end`. Calls after the client went away are ignored.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  /// A complete response with a Content-Length body.
  virtual void respond(int status, std::string content_type, std::string body,
                       std::vector<std::pair<std::string, std::string>> extra_headers = {}) = 0;
  /// Starts a chunked response (e.g. `text/event-stream`).
  virtual void start_stream(int status, std::string content_type) = 0;
  /// Appends one chunk to a started stream.
  virtual void write(std::string chunk) = 0;
  /// Ends a started stream.
  virtual void end() = 0;
  /// True once the client disconnected (or the connection failed).
  virtual bool closed() const = 0;
  /// `fn` runs once (on an I/O thread) if the client disconnects before the response ended.
  virtual void on_close(std::function<void()> fn) = 0;
  /// Extra text for this request's access-log line (tokens, TTFT, ...).
  virtual void set_log_info(std::string info) = 0;
};

using HttpHandler = std::function<void(HttpRequest, std::shared_ptr<ResponseWriter>)>;

/// Limits and deadlines of the server; defaults are suitable for an LLM API.
struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 30000;  // 0 = pick a free port
  int n_threads = 2;
  int64_t body_limit_bytes = 32ll << 20;
  std::chrono::milliseconds header_timeout{10'000};  // whole request head must arrive in time
  std::chrono::milliseconds body_timeout{60'000};
  std::chrono::milliseconds write_timeout{120'000};  // one write (≤ 1 MiB) may block this long
  /// Bytes a streaming response may have queued behind its client's reads before the stream is
  /// ended as a disconnect (status 499, the request cancelled): bounds the memory a client that
  /// stops reading can hold.
  int64_t max_stream_queue_bytes = 64ll << 20;
  std::chrono::milliseconds idle_timeout{120'000};   // keep-alive wait for the next request
  bool access_log = true;
};

/// The server: bind, run on `n_threads` I/O threads, dispatch every request to one handler.
/// The handler must not block (engine work is asynchronous; answer through the writer).
class HttpServer {
 public:
  HttpServer(HttpOptions options, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  /// Binds and starts the I/O threads; returns an error if the address cannot be bound.
  Status start();
  /// The bound port (useful with port 0).
  int port() const;
  /// Stops accepting, closes connections and joins the I/O threads. Bytes still queued on a
  /// connection are dropped (see wait_responses).
  void stop();
  /// Open connections right now.
  int64_t open_connections() const;
  /// Requests dispatched to the handler whose response is not yet completely written (nor the
  /// connection closed).
  int64_t pending_responses() const;
  /// Waits up to `timeout` until pending_responses() is 0, e.g. for the error events
  /// OpenAiApi::abort_generations queued to be written before stop(). True when it reached 0; a
  /// client that does not read keeps its response pending until the write deadline.
  bool wait_responses(std::chrono::milliseconds timeout) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Builds an HTTP response status reason phrase ("OK", "Not Found", ...).
const char* http_reason(int status);

}  // namespace v4::server
