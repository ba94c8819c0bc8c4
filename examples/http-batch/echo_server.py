"""A stand-in for a model server, to try examples/http-batch without a GPU: answers every POST
with an OpenAI-style completion that echoes the prompt. `python3 echo_server.py [PORT]`."""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Echo(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])) or b"{}")
        text = f" <echo of {body.get('prompt', '')!r}>"
        answer = json.dumps({"object": "text_completion", "choices": [{"text": text}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass  # quiet: the run's own log says what was sent


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    ThreadingHTTPServer(("127.0.0.1", port), Echo).serve_forever()
