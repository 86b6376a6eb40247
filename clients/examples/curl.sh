#!/bin/sh
# Examples of loom-server's OpenAI-compatible HTTP API with curl. Start the server first:
#   build/bin/loom-server --model build/default-model --port 8000
# Set LOOM_URL to point elsewhere and LOOM_API_KEY if the server runs with --api_key.
set -e
URL=${LOOM_URL:-http://127.0.0.1:8000}
AUTH=${LOOM_API_KEY:+-H "Authorization: Bearer $LOOM_API_KEY"}

echo "## models"
curl -s $AUTH "$URL/v1/models"; echo

echo "## completion"
curl -s $AUTH "$URL/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.8, "seed": 1}'; echo

echo "## chat, streamed (server-sent events; -N disables curl's buffering)"
curl -sN $AUTH "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16, "stream": true,
       "stream_options": {"include_usage": true}}'

echo "## chat with a tool"
curl -s $AUTH "$URL/v1/chat/completions" -H 'Content-Type: application/json' -d '{
  "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
  "tools": [{"type": "function", "function": {"name": "get_weather",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
  "max_tokens": 32}'; echo

echo "## tokenize / detokenize"
curl -s "$URL/tokenize" -H 'Content-Type: application/json' -d '{"prompt": "Hello"}'; echo
curl -s "$URL/detokenize" -H 'Content-Type: application/json' -d '{"tokens": [72, 101, 108, 108, 111]}'; echo

echo "## health and Prometheus metrics"
curl -s "$URL/health"; echo
curl -s "$URL/metrics" | grep -E '^loom_(kv_pages_free|state_slots_free|num_requests_running) '
