// libFuzzer target: arbitrary bytes through the expert-parallel nodes' message decoders
// (engine/parallel/node_wire.h), which read what other processes send over TCP. The first byte
// picks the decoder (for kPost the next two give the node's ranks and the group size); the rest is
// the message. Every accepted message must re-encode to exactly the bytes it came from (nothing
// read past the input, nothing invented), and a decoded post's rows must lie inside the input.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "engine/parallel/node_wire.h"

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::span<const char> all(reinterpret_cast<const char*>(data), size);
  const std::span<const char> body = all.subspan(1);
  const std::string in(body.begin(), body.end());
  switch (data[0] % 6) {
    case 0: {
      auto h = loom::decode_frame_header(body);
      if (h.ok()) require(loom::encode_frame_header(h->type, h->payload_bytes) == in);
      break;
    }
    case 1: {
      auto h = loom::decode_hello(body);
      if (h.ok() && h->protocol == loom::kNodeProtocolVersion)
        require(loom::encode_hello(*h) == in);
      break;
    }
    case 2: {
      auto w = loom::decode_welcome(body);
      if (w.ok()) require(loom::encode_welcome(*w) == in);
      break;
    }
    case 3: {
      auto st = loom::decode_status(body);
      if (st.ok()) require(!st->ok());
      break;
    }
    case 4: {
      if (size < 3) return 0;
      const int local = 1 + data[1] % 4, world = 1 + data[2] % 8;
      const std::span<const char> payload = all.subspan(3);
      auto p = loom::decode_post(payload, local, world);
      if (!p.ok()) break;
      require(static_cast<int>(p->posts.size()) == local);
      for (const loom::CollectivePost& q : p->posts) {
        const int64_t bytes = q.send_rows * q.row_bytes;
        require(q.send_rows == 0 ||
                (q.send >= payload.data() && q.send + bytes <= payload.data() + payload.size()));
      }
      require(loom::encode_post(p->posts, world) == std::string(payload.begin(), payload.end()));
      break;
    }
    case 5: {
      auto r = loom::decode_reply(body);
      if (r.ok())
        require(loom::encode_reply_header(r->seq) + std::string(r->data.begin(), r->data.end()) ==
                in);
      break;
    }
  }
  return 0;
}
