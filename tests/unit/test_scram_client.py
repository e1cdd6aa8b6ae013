"""The SCRAM client the quota requests log in with, against RFC 5802's own arithmetic."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from stepledger.errors import BrokerError
from stepledger.kafka.wireclient import Scram

SALT, ROUNDS, PASSWORD = b"pepper-salt", 4096, "s3cret"


def _server(scram: Scram, *, extend: bool = True, sign: bool = True) -> list[bytes]:
    """A broker's side of one exchange: its first message, then its signature."""
    sent: list[bytes] = []

    def exchange(message: bytes) -> bytes:
        sent.append(message)
        if len(sent) == 1:
            nonce = scram.nonce + "srv" if extend else "someone-elses-nonce"
            salt = base64.b64encode(SALT).decode()
            return f"r={nonce},s={salt},i={ROUNDS}".encode()
        first_bare = sent[0].decode()[3:]
        server_first = f"r={scram.nonce}srv,s={base64.b64encode(SALT).decode()},i={ROUNDS}"
        without_proof = message.decode().rsplit(",p=", 1)[0]
        auth = f"{first_bare},{server_first},{without_proof}".encode()
        salted = hashlib.pbkdf2_hmac("sha512", PASSWORD.encode(), SALT, ROUNDS)
        client_key = hmac.new(salted, b"Client Key", "sha512").digest()
        stored = hashlib.sha512(client_key).digest()
        signature = hmac.new(stored, auth, "sha512").digest()
        proof = base64.b64decode(message.decode().rsplit(",p=", 1)[1])
        assert bytes(a ^ b for a, b in zip(proof, signature, strict=True)) == client_key
        server_key = hmac.new(salted, b"Server Key", "sha512").digest()
        verifier = hmac.new(server_key, auth, "sha512").digest() if sign else b"forged"
        return b"v=" + base64.b64encode(verifier)

    scram.run(exchange)
    return sent


def test_a_login_proves_the_password_and_checks_the_brokers_signature() -> None:
    sent = _server(Scram("sha512", "fleet-a.agent", PASSWORD))
    assert sent[0].startswith(b"n,,n=fleet-a.agent,r=") and PASSWORD.encode() not in b"".join(sent)


def test_a_broker_that_does_not_extend_our_nonce_gets_no_proof() -> None:
    scram = Scram("sha512", "fleet-a.agent", PASSWORD)
    with pytest.raises(BrokerError, match="nonce is not ours"):
        _server(scram, extend=False)


def test_a_wrong_server_signature_is_refused() -> None:
    with pytest.raises(BrokerError, match="signature is wrong"):
        _server(Scram("sha512", "fleet-a.agent", PASSWORD), sign=False)
