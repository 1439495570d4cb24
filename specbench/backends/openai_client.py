"""A streaming client of an OpenAI-compatible server (/v1/models, /v1/chat/completions with "stream": true), on the
standard library alone (urllib): whatever serves the API (vLLM, SGLang, llama.cpp's llama-server, llama-cpp-python,
TensorRT-LLM's trtllm-serve) is measured the same way, and `--engine openai` needs no extra package.

One request's timing (perf_counter, on this machine, so it includes the network and the server's queue):
  sent           the request is written
  token_times    seconds from `sent` to the arrival of each streamed token (a chunk carrying k tokens gives k equal
                 times: a speculative server may send an accepted draft in one chunk)
  wall_s         seconds from `sent` to the end of the stream ([DONE] or the connection's end)

Tokens: the server's own token strings from `logprobs.content[*].token` when it returns logprobs (the lossless check
then compares token by token), else one entry per non-empty content delta (compared as text): `Streamed.unit` says
which. Counted tokens prefer the server's `usage.completion_tokens` when it sends one (stream_options.include_usage).
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from ..errors import SpecbenchError


class ServerError(Exception):
    """A request that failed: the URL, the HTTP status (0: no answer) and what the server or the socket said.
    `retry` says whether trying again can help (no answer, a timeout, 5xx, 429); a 4xx will fail the same way."""

    def __init__(self, url: str, status: int, detail: str):
        super().__init__(f"{url}: {f'HTTP {status}: ' if status else ''}{detail}")
        self.url, self.status, self.detail = url, status, detail

    @property
    def retry(self) -> bool:
        return self.status == 0 or self.status >= 500 or self.status == 429


@dataclass
class Streamed:
    """What one streamed chat completion returned."""

    tokens: list[str] = field(default_factory=list)  # token strings (logprobs) or content pieces (text)
    text: str = ""
    token_times: list[float] = field(default_factory=list)  # seconds from sending to each token's arrival
    wall_s: float = 0.0
    unit: str = "text"  # "tokens": tokens are the server's tokens (logprobs); "text": content pieces
    finish_reason: str | None = None
    usage: dict = field(default_factory=dict)  # the server's usage block, when it sent one
    extra: dict = field(default_factory=dict)  # the chunks' non-standard fields (timings, meta_info), last seen wins
    top: list[dict] = field(default_factory=list)  # per token, {token: score} of its top_logprobs (when asked for)

    @property
    def completion_tokens(self) -> int:
        """Tokens the server generated: its usage count when it gave one, else the tokens seen."""
        counted = self.usage.get("completion_tokens")
        return int(counted) if isinstance(counted, (int, float)) and counted >= 0 else len(self.tokens)


class Endpoint:
    """One server: its base URL (".../v1"), an optional API key and the seconds to wait for an answer."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 60.0):
        self.base_url = base_url.rstrip("/")
        self.api_key, self.timeout = api_key, timeout

    def _request(self, path: str, body: dict | None = None) -> urllib.request.Request:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        return urllib.request.Request(self.base_url + path, data=data, headers=headers,
                                      method="POST" if body is not None else "GET")

    def _open(self, request: urllib.request.Request):
        """The open response, or ServerError naming the URL (refused, timed out, HTTP error with its body)."""
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace")[:500] if exc.fp else ""
            raise ServerError(request.full_url, exc.code, " ".join(body.split()) or exc.reason) from None
        except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServerError(request.full_url, 0, f"no answer ({reason})") from None

    def get_json(self, path: str) -> dict:
        with self._open(self._request(path)) as resp:
            return json.loads(resp.read().decode())

    def get_text(self, path: str) -> str:
        with self._open(self._request(path)) as resp:
            return resp.read().decode(errors="replace")

    def models(self) -> list[str]:
        """The model ids the server lists at /models."""
        try:
            data = self.get_json("/models")
        except json.JSONDecodeError as exc:
            raise ServerError(self.base_url + "/models", 0, f"not JSON ({exc})") from None
        return [str(m.get("id")) for m in data.get("data", []) if isinstance(m, dict)]

    def stream_chat(self, model: str, messages: list[dict], max_tokens: int, logprobs: bool = True,
                    extra: dict | None = None) -> Streamed:
        """One greedy streamed chat completion (temperature 0). Raises ServerError on a failed request, and on a
        stream that stops with an error event or times out mid-way (what arrived is not a finished answer)."""
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
                "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
        if logprobs:
            body["logprobs"] = True
        request = self._request("/chat/completions", body)
        out = Streamed(unit="tokens" if logprobs else "text")
        sent = time.perf_counter()
        with self._open(request) as resp:
            try:
                for raw in resp:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    chunk = json.loads(payload)
                    if "error" in chunk:
                        raise ServerError(request.full_url, 0, f"error mid-stream: {chunk['error']}")
                    _take(out, chunk, time.perf_counter() - sent, logprobs)
            except (socket.timeout, TimeoutError, ConnectionError, OSError) as exc:
                raise ServerError(request.full_url, 0, f"stream broke off after {len(out.tokens)} tokens "
                                                       f"({exc})") from None
            except json.JSONDecodeError as exc:
                raise ServerError(request.full_url, 0, f"a chunk that is not JSON ({exc})") from None
        out.wall_s = time.perf_counter() - sent
        if logprobs and out.text and not out.tokens:  # the server ignored logprobs: compare the text instead
            out.unit = "text"
        return out


STANDARD = {"id", "object", "created", "model", "choices", "usage", "system_fingerprint", "service_tier"}


def _take(out: Streamed, chunk: dict, at: float, logprobs: bool) -> None:
    """Fold one chunk into `out`: its content, its tokens (logprobs entries, else the content piece) with their
    arrival time, the finish reason, usage and any non-standard field (timings, meta_info)."""
    for key, value in chunk.items():
        if key not in STANDARD:
            out.extra[key] = value
    if isinstance(chunk.get("usage"), dict):
        out.usage = chunk["usage"]
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        piece = delta.get("content") or ""
        out.text += piece
        entries = ((choice.get("logprobs") or {}).get("content") or []) if logprobs else []
        if entries:
            out.tokens += [str(e.get("token", "")) for e in entries]
            out.top += [{str(t.get("token", "")): t.get("logprob") for t in e.get("top_logprobs") or []
                         if isinstance(t, dict)} for e in entries]
            out.token_times += [at] * len(entries)
        elif piece:
            out.tokens.append(piece)
            out.token_times.append(at)
        for key in ("meta_info", "timings"):  # per-choice extras some servers put here
            if key in choice:
                out.extra[key] = choice[key]
        if choice.get("finish_reason"):
            out.finish_reason = choice["finish_reason"]


def unreachable(url: str, exc: ServerError, timeout: float) -> SpecbenchError:
    """The user's error for a server that does not answer before the run starts."""
    if exc.status:
        return SpecbenchError(f"{exc}\n  hint: is --base-url/--baseline-url the OpenAI-compatible root (it usually "
                              "ends in /v1)? Check it with `curl URL/models`")
    return SpecbenchError(f"no OpenAI-compatible server answered at {url} within {timeout:g} s ({exc.detail})\n"
                          "  hint: start the server first, check --base-url/--baseline-url (e.g. "
                          "http://127.0.0.1:8000/v1), or raise --timeout")
