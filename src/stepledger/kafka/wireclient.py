"""One authenticated connection for the admin requests librdkafka lacks (client quotas).

confluent-kafka 2.16 has no ``alter_client_quotas`` (KIP-546 is not in librdkafka yet), so
:mod:`~stepledger.kafka.quotas` sends its two requests itself over this: a socket to a
bootstrap server (TLS when the settings say ``SSL``/``SASL_SSL``), SASL PLAIN or
SCRAM-SHA-256/512 as librdkafka would log in with the same settings, then request/response
frames in Kafka's non-flexible encoding.  Only the settings librdkafka reads are used, so one
config file serves both.  A refused login is the same one line as every refusal
(:func:`~stepledger.kafka.identity.refused_login`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import socket
import ssl
import struct
from collections.abc import Callable
from types import TracebackType

from stepledger.config import Settings
from stepledger.errors import BrokerError, ConfigError, NotAuthorisedError
from stepledger.kafka.identity import refused_login

_SASL_HANDSHAKE, _SASL_AUTHENTICATE = 17, 36
_SASL_AUTHENTICATION_FAILED = 58
_CLIENT_ID = b"stepledger-admin"
_TIMEOUT_S = 10.0
#: A response larger than this is no answer to our requests (a misread frame).
_MAX_FRAME = 16 * 1024 * 1024
_SCRAM = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


def login_refused(settings: Settings) -> bool:
    """True when the broker refuses these settings' login (False: logged in, or not reached)."""
    try:
        with Connection(settings):
            return False
    except NotAuthorisedError:
        return True
    except (BrokerError, ConfigError, OSError):
        return False


class Writer:
    """A request body in Kafka's non-flexible encoding (big-endian, int16-length strings)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def int8(self, value: int) -> Writer:
        self.parts.append(struct.pack(">b", value))
        return self

    def int32(self, value: int) -> Writer:
        self.parts.append(struct.pack(">i", value))
        return self

    def float64(self, value: float) -> Writer:
        self.parts.append(struct.pack(">d", value))
        return self

    def string(self, value: str | None) -> Writer:
        """A (nullable) string: int16 length, -1 for null."""
        if value is None:
            self.parts.append(struct.pack(">h", -1))
            return self
        raw = value.encode()
        self.parts.append(struct.pack(">h", len(raw)) + raw)
        return self

    def bytes_(self, value: bytes) -> Writer:
        self.parts.append(struct.pack(">i", len(value)) + value)
        return self

    def build(self) -> bytes:
        return b"".join(self.parts)


class Reader:
    """A response body read in the same encoding; a short body is a BrokerError."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def _take(self, fmt: str) -> int | float:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise BrokerError("the broker's answer ended early (not a Kafka response?)")
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return value  # type: ignore[no-any-return]

    def int8(self) -> int:
        return int(self._take(">b"))

    def int16(self) -> int:
        return int(self._take(">h"))

    def int32(self) -> int:
        return int(self._take(">i"))

    def int64(self) -> int:
        return int(self._take(">q"))

    def float64(self) -> float:
        return float(self._take(">d"))

    def string(self) -> str | None:
        size = self.int16()
        if size < 0:
            return None
        raw = self.data[self.at : self.at + size]
        self.at += size
        return raw.decode()

    def bytes_(self) -> bytes:
        size = self.int32()
        raw = self.data[self.at : self.at + max(size, 0)]
        self.at += max(size, 0)
        return raw

    def array(self, item: Callable[[Reader], object]) -> list[object]:
        return [item(self) for _ in range(max(self.int32(), 0))]


class Connection:
    """One logged-in connection to a broker of ``settings``; closed on exit."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.protocol = settings.kafka.get("security.protocol", "PLAINTEXT").upper()
        self._sock: socket.socket | None = None
        self._correlation = 0

    def __enter__(self) -> Connection:
        self._sock = self._connect()
        if self.protocol.startswith("SASL_"):
            self._login()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._sock is not None:
            self._sock.close()

    def request(self, api_key: int, version: int, body: bytes) -> Reader:
        """Send one request (header v1) and return its response body (header v0 read)."""
        assert self._sock is not None, "used inside its with block"
        self._correlation += 1
        header = struct.pack(">hhih", api_key, version, self._correlation, len(_CLIENT_ID))
        frame = header + _CLIENT_ID + body
        try:
            self._sock.sendall(struct.pack(">i", len(frame)) + frame)
            size = struct.unpack(">i", self._exactly(4))[0]
            if not 4 <= size <= _MAX_FRAME:
                raise BrokerError(f"the broker at {self.settings.bootstrap} answered a bad frame")
            answer = Reader(self._exactly(size))
        except OSError as exc:
            raise BrokerError(f"cannot reach Kafka at {self.settings.bootstrap}: {exc}") from None
        if answer.int32() != self._correlation:
            raise BrokerError("the broker answered another request (correlation id)")
        return answer

    def _exactly(self, size: int) -> bytes:
        assert self._sock is not None
        chunks, left = [], size
        while left:
            chunk = self._sock.recv(left)
            if not chunk:
                raise OSError("connection closed by the broker")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _connect(self) -> socket.socket:
        if self.protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise ConfigError(f"security.protocol {self.protocol!r} is not one Kafka knows")
        failures = []
        for server in self.settings.bootstrap.split(","):
            host, _, port = server.strip().rpartition(":")
            try:
                sock = socket.create_connection((host.strip("[]"), int(port)), _TIMEOUT_S)
            except OSError as exc:
                failures.append(f"{server.strip()}: {exc}")
                continue
            sock.settimeout(_TIMEOUT_S)
            if self.protocol.endswith("SSL"):
                return self._tls().wrap_socket(sock, server_hostname=host.strip("[]"))
            return sock
        raise BrokerError(f"cannot reach Kafka at {self.settings.bootstrap}: {'; '.join(failures)}")

    def _tls(self) -> ssl.SSLContext:
        kafka = self.settings.kafka
        context = ssl.create_default_context(cafile=kafka.get("ssl.ca.location"))
        if kafka.get("ssl.endpoint.identification.algorithm", "https") == "none":
            context.check_hostname = False
        if "ssl.certificate.location" in kafka:
            context.load_cert_chain(
                kafka["ssl.certificate.location"],
                kafka.get("ssl.key.location"),
                kafka.get("ssl.key.password"),
            )
        return context

    def _login(self) -> None:
        kafka = self.settings.kafka
        mechanism = kafka.get("sasl.mechanism", kafka.get("sasl.mechanisms", "GSSAPI")).upper()
        if mechanism != "PLAIN" and mechanism not in _SCRAM:
            raise ConfigError(
                f"sasl.mechanism {mechanism} is not spoken by stepledger's quota requests "
                "(PLAIN, SCRAM-SHA-256/512 are): apply the quotas `fleet acls` prints"
            )
        answer = self.request(_SASL_HANDSHAKE, 1, Writer().string(mechanism).build())
        if (code := answer.int16()) != 0:
            raise BrokerError(f"the broker refused SASL mechanism {mechanism} (error {code})")
        user, password = kafka.get("sasl.username", ""), kafka.get("sasl.password", "")
        if mechanism == "PLAIN":
            self._authenticate(f"\0{user}\0{password}".encode())
            return
        Scram(_SCRAM[mechanism], user, password).run(self._authenticate)

    def _authenticate(self, payload: bytes) -> bytes:
        answer = self.request(_SASL_AUTHENTICATE, 1, Writer().bytes_(payload).build())
        code, message = answer.int16(), answer.string()
        if code == _SASL_AUTHENTICATION_FAILED:
            raise refused_login(self.settings)
        if code != 0:
            raise BrokerError(f"login failed: {message or f'error {code}'}", retryable=False)
        return answer.bytes_()


class Scram:
    """The client side of SCRAM (RFC 5802) without channel binding, as Kafka speaks it."""

    def __init__(self, digest: str, user: str, password: str) -> None:
        self.digest, self.password = digest, password
        name = user.replace("=", "=3D").replace(",", "=2C")
        self.nonce = secrets.token_urlsafe(24)
        self.first_bare = f"n={name},r={self.nonce}"

    def run(self, exchange: Callable[[bytes], bytes]) -> None:
        """Log in through ``exchange`` (send a message, return the server's answer)."""
        server_first = exchange(f"n,,{self.first_bare}".encode()).decode()
        fields = dict(part.split("=", 1) for part in server_first.split(","))
        nonce, salt, rounds = fields["r"], base64.b64decode(fields["s"]), int(fields["i"])
        if not nonce.startswith(self.nonce) or nonce == self.nonce:
            # RFC 5802: the server's nonce extends the client's (a replayed or forged first
            # message does not), and no proof of the password is sent to anyone else.
            raise BrokerError("the broker's SCRAM nonce is not ours: not the broker we asked")
        salted = hashlib.pbkdf2_hmac(self.digest, self.password.encode(), salt, rounds)
        client_key = self._hmac(salted, b"Client Key")
        without_proof = f"c=biws,r={nonce}"
        auth = f"{self.first_bare},{server_first},{without_proof}".encode()
        signature = self._hmac(hashlib.new(self.digest, client_key).digest(), auth)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        final = exchange(f"{without_proof},p={base64.b64encode(proof).decode()}".encode())
        expected = self._hmac(self._hmac(salted, b"Server Key"), auth)
        if not hmac.compare_digest(final, f"v={base64.b64encode(expected).decode()}".encode()):
            raise BrokerError("the broker's SCRAM signature is wrong: not the broker we asked")

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self.digest).digest()
