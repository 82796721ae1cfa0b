"""HEAD, CORS, /tokenize, /detokenize, /version, /v1/models' max_model_len, the API key from the
environment, and a burst of 300 connections all answered."""

import json
import socket

import pytest
from absl import flags

from helios_jax import __version__
from helios_jax.serve.app import make_server
from helios_jax.serve.fake import FakeEngine
from helios_jax.serve.flags import ServerConfig, config_from_flags, define_flags

from .helpers import get, live_server, post, request

ORIGIN = "http://app.example"


@pytest.fixture(scope="module")
def server():
    with live_server(FakeEngine(max_model_len=64), allowed_origins=(ORIGIN,)) as server:
        yield server


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/metrics", "/version"])
def test_head_answers_every_get_route_without_a_body(server, path):
    head, full = request(server, "HEAD", path), get(server, path)
    assert (head.status, head.body) == (200, b"")
    assert head.headers["content-type"] == full.headers["content-type"]
    if path != "/metrics":  # the metrics text changes between the two requests
        assert head.headers["content-length"] == full.headers["content-length"] == str(len(full.body))


def test_cors_preflight_and_simple_requests_for_an_allowed_origin(server):
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    r = request(server, "OPTIONS", "/v1/completions", headers=preflight)
    assert r.status == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    r = post(server, "/v1/completions", {"prompt": "a", "max_tokens": 1}, headers={"Origin": ORIGIN})
    assert r.status == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    r = get(server, "/health", headers={"Origin": "http://elsewhere.example"})
    assert "access-control-allow-origin" not in r.headers


def test_cors_is_off_by_default():
    with live_server(FakeEngine()) as plain:
        r = get(plain, "/health", headers={"Origin": ORIGIN})
        assert r.status == 200 and "access-control-allow-origin" not in r.headers
        r = request(plain, "OPTIONS", "/v1/completions", headers={"Origin": ORIGIN})
        assert r.status == 405


def test_models_carry_max_model_len(server):
    (entry,) = get(server, "/v1/models").json()["data"]
    assert (entry["id"], entry["max_model_len"], entry["root"]) == ("helios-fake", 64, "helios-fake")


def test_tokenize_a_prompt_and_messages_as_generation_would(server):
    r = post(server, "/tokenize", {"prompt": "hi", "return_token_strs": True})
    assert r.json() == {"count": 2, "max_model_len": 64, "tokens": [104, 105], "token_strs": ["h", "i"]}
    r = post(server, "/tokenize", {"model": "helios-fake", "messages": [{"role": "user", "content": "hi"}]})
    body = r.json()
    assert body["count"] == 20 and body["token_strs"] is None
    assert "".join(map(chr, body["tokens"])) == "user: hi\nassistant: "
    assert post(server, "/tokenize", {"prompt": "a", "model": "other"}).status == 404
    assert post(server, "/tokenize", {}).json()["error"]["code"] == "missing_field"


def test_detokenize_and_version(server):
    assert post(server, "/detokenize", {"tokens": [104, 105]}).json() == {"prompt": "hi"}
    r = post(server, "/detokenize", {"tokens": [104, -1]})
    assert (r.status, r.json()["error"]["param"]) == (400, "tokens")
    r = post(server, "/detokenize", {"tokens": "hi"})
    assert (r.status, r.json()["error"]["code"]) == (400, "invalid_type")
    assert get(server, "/version").json() == {"version": __version__}


def test_tokenize_needs_the_key_and_version_does_not():
    with live_server(FakeEngine(), api_key="k") as keyed:
        assert post(keyed, "/tokenize", {"prompt": "a"}).status == 401
        assert post(keyed, "/detokenize", {"tokens": [97]}).status == 401
        assert post(keyed, "/tokenize", {"prompt": "a"}, headers={"Authorization": "Bearer k"}).status == 200
        assert get(keyed, "/version").status == 200


def parse_config(args, environ):
    fv = flags.FlagValues()
    define_flags(fv)
    fv(["serve", *args])
    return config_from_flags(fv, environ)


def test_the_api_key_comes_from_the_flag_then_the_environment():
    both = {"HELIOS_API_KEY": "h", "VLLM_API_KEY": "v"}
    assert parse_config(["--api_key=f"], both).api_key == "f"
    assert parse_config([], both).api_key == "h"
    assert parse_config([], {"VLLM_API_KEY": "v"}).api_key == "v"
    assert parse_config([], {"HELIOS_API_KEY": " ", "VLLM_API_KEY": "v"}).api_key == "v"  # blank: unset
    assert parse_config([], {}).api_key is None


def test_three_hundred_connections_at_once_are_all_answered():
    """300 connections are opened, and their requests sent, before the server accepts any: they
    wait in the listen backlog (a backlog of 5 would leave all but a handful unconnected)."""
    body = json.dumps({"prompt": "a", "max_tokens": 1}).encode()
    raw = (
        b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    server = make_server(ServerConfig(port=0, engine="fake"), FakeEngine())
    try:
        socks = [socket.create_connection(("127.0.0.1", server.port), timeout=2) for _ in range(300)]
        for sock in socks:
            sock.sendall(raw)
        server.start()
        statuses = []
        for sock in socks:
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
            sock.close()
            statuses.append(received.split(b" ", 2)[1])
    finally:
        server.stop()
    assert statuses == [b"200"] * 300
