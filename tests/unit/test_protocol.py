"""The wire protocol, sans I/O: frames, the decoder's edge cases and the HMAC check."""

from __future__ import annotations

import hashlib
import hmac
import struct

import msgpack
import pytest

from bellis._protocol import (
    _AUTH_TAG,
    ACQUIRE,
    HELLO,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    SEND,
    FrameDecoder,
    compute_mac,
    encode,
    hmac_sha256,
    new_nonce,
    new_secret,
    verify_mac,
    worker_token,
)
from bellis.errors import ProtocolError


def raw_frame(payload: bytes, version: int = PROTOCOL_VERSION) -> bytes:
    return struct.pack(">IB", len(payload) + 1, version) + payload


def test_round_trip() -> None:
    msg = [ACQUIRE, 7, 2, [1.5, 2.5], "trace\nback", b"\x00\xff"]
    frame = encode(msg)
    assert frame[4] == PROTOCOL_VERSION
    assert struct.unpack(">I", frame[:4])[0] == len(frame) - 4
    assert FrameDecoder().feed(frame) == [msg]


def test_byte_by_byte_feed() -> None:
    msgs = [[SEND, k] for k in range(5)]
    data = b"".join(encode(m) for m in msgs)
    dec = FrameDecoder()
    out = []
    for i in range(len(data)):
        out += dec.feed(data[i : i + 1])
    assert out == msgs
    assert dec.buffered_bytes == 0


def test_merged_and_split_frames() -> None:
    a, b, c = encode([SEND, 1]), encode([SEND, 2]), encode([HELLO, b"m", "t", 3, 4, 0.5])
    dec = FrameDecoder()
    data = a + b + c
    cut = len(a) + len(b) + 3
    assert dec.feed(data[:cut]) == [[SEND, 1], [SEND, 2]]
    assert dec.buffered_bytes == 3
    assert dec.feed(data[cut:]) == [[HELLO, b"m", "t", 3, 4, 0.5]]


def test_truncated_input_yields_nothing_yet() -> None:
    frame = encode([SEND, 99])
    dec = FrameDecoder()
    assert dec.feed(frame[:3]) == []  # not even a header
    assert dec.feed(frame[3:-1]) == []  # header, partial payload
    assert dec.buffered_bytes == len(frame) - 1
    assert dec.feed(frame[-1:]) == [[SEND, 99]]


def test_oversized_length_is_rejected() -> None:
    header = struct.pack(">IB", MAX_FRAME_BYTES + 1, PROTOCOL_VERSION)
    with pytest.raises(ProtocolError, match="outside"):
        FrameDecoder().feed(header)
    with pytest.raises(ProtocolError):
        FrameDecoder(max_frame_bytes=8).feed(raw_frame(b"\x00" * 20))


def test_encode_refuses_oversized_message() -> None:
    with pytest.raises(ProtocolError, match="frame cap"):
        encode([SEND, b"\x00" * MAX_FRAME_BYTES])


def test_zero_length_is_rejected() -> None:
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(struct.pack(">IB", 0, PROTOCOL_VERSION))


def test_wrong_version_names_both_versions() -> None:
    with pytest.raises(ProtocolError) as info:
        FrameDecoder().feed(raw_frame(msgpack.packb([SEND, 1]), version=PROTOCOL_VERSION + 6))
    text = str(info.value)
    assert f"peer speaks {PROTOCOL_VERSION + 6}" in text
    assert f"speaks {PROTOCOL_VERSION}" in text


def test_garbage_payload() -> None:
    with pytest.raises(ProtocolError, match="malformed"):
        FrameDecoder().feed(raw_frame(b"\xc1\xc1\xc1"))


@pytest.mark.parametrize(
    "obj",
    [{"op": 1}, 5, "text", [], ["not an opcode", 1]],
    ids=["map", "int", "str", "empty", "op"],
)
def test_payload_that_is_not_an_opcode_list(obj: object) -> None:
    with pytest.raises(ProtocolError, match="opcode"):
        FrameDecoder().feed(raw_frame(msgpack.packb(obj)))


def test_nothing_is_unpickled() -> None:
    # msgpack ext types come back as plain ExtType values, never as objects
    payload = msgpack.packb([SEND, msgpack.ExtType(1, b"cos\nsystem\n")])
    (msg,) = FrameDecoder().feed(raw_frame(payload))
    assert isinstance(msg[1], msgpack.ExtType)


def test_mac_verification() -> None:
    secret, nonce = new_secret(), new_nonce()
    assert len(secret) == 32 and len(nonce) == 32
    mac = compute_mac(secret, nonce)
    assert verify_mac(secret, nonce, mac)
    assert not verify_mac(secret, new_nonce(), mac)
    assert not verify_mac(new_secret(), nonce, mac)
    assert not verify_mac(secret, nonce, mac[:-1])
    assert not verify_mac(secret, nonce, mac.hex())
    assert not verify_mac(secret, nonce, None)


@pytest.mark.parametrize("key_size", [0, 1, 32, 63, 64, 65, 200])
@pytest.mark.parametrize("message_size", [0, 1, 36, 64, 1000])
def test_hmac_sha256_is_the_standard_one(key_size: int, message_size: int) -> None:
    # the worker's handshake computes HMAC-SHA256 without hashlib and hmac (they load
    # OpenSSL): it must give the standard library's bytes for keys shorter than, equal to
    # and longer than SHA-256's block
    key = bytes((7 * i + 3) % 256 for i in range(key_size))
    message = bytes((5 * i + 1) % 256 for i in range(message_size))
    expected = hmac.new(key, message, hashlib.sha256).digest()
    assert hmac_sha256(key, message) == expected


def test_macs_and_tokens_are_hmac_sha256() -> None:
    secret, nonce = new_secret(), new_nonce()
    # the answer to a challenge: the nonce and the protocol's tag, as before the change
    expected = hmac.new(secret, nonce + _AUTH_TAG, hashlib.sha256).digest()
    assert compute_mac(secret, nonce) == expected
    assert verify_mac(secret, nonce, compute_mac(secret, nonce))
    assert worker_token(secret, 3) == hmac.new(secret, b"worker:3", hashlib.sha256).digest()
