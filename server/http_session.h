// HttpSession: one client connection (HTTP/1.1, keep-alive), running on its own strand of the
// server's io_context. Reads a request (idle timeout until its first byte, then a header timeout
// for the whole request; body and header size limits), answers plain routes at once, and drives
// generations: engine events arrive from the StreamPump (posted to the strand), go through the
// response builder and are written as SSE chunks or one JSON body. While a generation runs, a read
// watches the socket: EOF or an error means the client left, and the session cancels its engine
// requests (their pages and slot are freed at the engine's next step).
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <memory>

#include "server/http_context.h"

namespace loom {

// Starts serving `socket` (whose executor must be a strand); the session keeps itself alive
// through its pending operations.
void start_http_session(boost::asio::ip::tcp::socket socket, HttpContext& ctx);

}  // namespace loom
