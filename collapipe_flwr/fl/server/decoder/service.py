"""The server's decoder / task head served to the CUs over the data plane: its lifecycle in one place.

Methods that keep the head on the server (``method.head_on_server``) start one
:class:`~collapipe_flwr.fl.dataplane.DecoderHost` for the run; each round opens it to the selected
clusters and closes it after their replies, so no step of a closed round touches the head. Methods that
train the head on the CU have no data plane: every call here is then a no-op and the address is "".
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.dataplane.auth import cluster_key
from collapipe_flwr.fl.server.decoder.host import DecoderHost
from collapipe_flwr.fl.server.decoder.host_spec import DecoderHostSpec
from collapipe_flwr.models.split import TaskHead


@dataclass(frozen=True)
class TlsFiles:
    """The data plane's TLS material (PEM files): the server certificate and key, and optionally the CA that
    signed the certificate (CUs are told to trust the CA, else the certificate itself)."""

    cert: str
    key: str
    ca: str = ""

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(certificate, key, what CUs trust); a one-line error naming a file that cannot be read."""
        out = []
        for what, path in (
            ("dataplane.tls_cert", self.cert),
            ("dataplane.tls_key", self.key),
            ("dataplane.tls_ca", self.ca or self.cert),
        ):
            try:
                out.append(Path(path).expanduser().read_bytes())
            except OSError as err:
                raise ConfigError(f"cannot read {what}={path!r}: {err.strerror}; give a PEM file") from None
        return out[0], out[1], out[2]


class DecoderService:
    """The data-plane host of the head (or nothing), its secret and the address CUs are told."""

    def __init__(self, host: DecoderHost | None, announce_host: str, secret: str, root_certificate: str = "") -> None:
        self.host = host
        self.announce_host = announce_host
        self.secret = secret
        self.root_certificate = root_certificate  # what CUs trust for TLS ("" = plaintext)

    @classmethod
    def start(
        cls,
        head: TaskHead,
        optimizer: torch.optim.Optimizer,
        spec: DecoderHostSpec | None,
        *,
        announce_host: str,
        lr_factor_of: Callable[[int, int], float],
        tls: TlsFiles | None = None,
    ) -> DecoderService:
        """Start serving ``head`` with the host settings ``spec`` (None: the method keeps the head on the CU, no
        data plane); ``lr_factor_of(round, seq)`` is the decoder's LR factor."""
        secret = secrets.token_hex(16)
        if spec is None:
            return cls(None, announce_host, secret)
        pems = tls.read() if tls is not None else None
        host = DecoderHost(
            head,
            optimizer,
            secret,
            spec,
            lr_factor_of=lr_factor_of,
            tls=(pems[0], pems[1]) if pems is not None else None,
        )
        host.start()
        return cls(host, announce_host, secret, pems[2].decode("utf-8") if pems is not None else "")

    def key_for(self, t: int, cluster: int) -> str:
        """The data-plane key only CU n gets, in its round-t train message (fl/dataplane/auth.py)."""
        return cluster_key(self.secret, t, cluster)

    @property
    def address(self) -> str:
        return "" if self.host is None else f"{self.announce_host}:{self.host.port}"

    def steps_served(self) -> dict[int, int]:
        """{cluster n: decoder steps served over the data plane so far in the run} ({} without one)."""
        if self.host is None:
            return {}
        return {int(n): int(c["steps"]) for n, c in self.host.stats()["clusters"].items()}

    def head_cpu_seconds(self) -> dict[int, float]:
        """{cluster n: CPU seconds the decoder's head steps for n took so far in the run} ({} without one): the
        virtual clock's server part of each cluster's round (a joint decoder update counts none)."""
        if self.host is None:
            return {}
        return {int(n): float(c["cpu_head"]) for n, c in self.host.stats()["clusters"].items()}

    def open_round(self, t: int, clusters: list[int]) -> None:
        if self.host is not None:
            self.host.open_round(t, clusters)

    def close_round(self) -> None:
        if self.host is not None:
            self.host.close_round()

    @contextlib.contextmanager
    def head_locked(self) -> Iterator[None]:
        """Hold the host's lock (no CU step changes the head meanwhile); a no-op without a data plane."""
        lock = self.host.lock if self.host is not None else threading.Lock()
        with lock:
            yield

    def stop(self) -> None:
        if self.host is not None:
            self.host.stop()
