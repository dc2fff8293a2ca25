"""What the data plane's tests share: small decoder heads, a step's activations, a served host with its clients,
raw streams and frames, and the ``transport`` and ``served`` fixtures (a test module imports the fixtures it
names)."""

from __future__ import annotations

import copy
import dataclasses
import threading

import grpc
import pytest
import torch
from torch import nn

from collapipe_flwr.fl.dataplane import DecoderClient, DecoderClientSpec
from collapipe_flwr.fl.dataplane.auth import call_metadata, cluster_key
from collapipe_flwr.fl.dataplane.backend import TRANSPORTS
from collapipe_flwr.fl.dataplane.protocol import FULL_METHOD
from collapipe_flwr.fl.dataplane.wire import decode_frame
from collapipe_flwr.fl.server.decoder.host import DecoderHost
from collapipe_flwr.fl.server.decoder.host_spec import DecoderHostSpec
from collapipe_flwr.pipeline.microbatch import split_batch

H, C, SECRET = 16, 5, "run-secret-1234"


class TokenHead(nn.Module):
    """Token classifier (NER-like): labels [B, T] with -100 ignored."""

    def __init__(self, hidden: int = H, classes: int = C) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, classes)

    def loss_terms(self, hidden, attention_mask, batch):
        logits = self.out(torch.tanh(self.proj(hidden)))
        labels = batch["labels"]
        loss_sum = nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum"
        )
        return loss_sum, (labels != -100).sum()


class SequenceHead(nn.Module):
    """Sentence classifier: masked mean pooling, labels [B]."""

    def __init__(self, hidden: int = H, classes: int = C) -> None:
        super().__init__()
        self.out = nn.Linear(hidden, classes)

    def loss_terms(self, hidden, attention_mask, batch):
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)
        loss_sum = nn.functional.cross_entropy(self.out(pooled), batch["labels"], reduction="sum")
        return loss_sum, torch.tensor(batch["labels"].shape[0])


class GatedHead(TokenHead):
    """Blocks each forward until ``gate`` is set: a decoder that is too slow for the client's timeout."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def __deepcopy__(self, memo):  # the reference copy is an ordinary TokenHead (an Event cannot be copied)
        twin = TokenHead()
        twin.load_state_dict(self.state_dict())
        return twin

    def loss_terms(self, hidden, attention_mask, batch):
        self.gate.wait(10)
        return super().loss_terms(hidden, attention_mask, batch)


def make_step(seed: int, b: int = 6, t: int = 7, m: int = 2, sequence: bool = False, hidden: int = H):
    """(z_enc list, micro-batches) like a pipeline would hand to its HeadFn: padded tokens, -100 labels."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    batch = {"input_ids": torch.randint(5, 50, (b, t), generator=g) * mask, "attention_mask": mask}
    if sequence:
        batch["labels"] = torch.randint(0, C, (b,), generator=g)
    else:
        batch["labels"] = torch.where(mask.bool(), torch.randint(0, C, (b, t), generator=g), torch.full((b, t), -100))
    mbs = split_batch(batch, m)
    z = [torch.randn(int(mb["input_ids"].shape[0]), t, hidden, generator=g) * 3.0 for mb in mbs]
    return z, mbs


def snapshot(head: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    return copy.deepcopy(head.state_dict()), copy.deepcopy(optimizer.state_dict())


def assert_same_state(a: tuple[dict, dict], b: tuple[dict, dict]) -> None:
    (wa, oa), (wb, ob) = a, b
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert oa["param_groups"] == ob["param_groups"]
    assert oa["state"].keys() == ob["state"].keys()
    for p in oa["state"]:
        for k, v in oa["state"][p].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(ob["state"][p][k])), (p, k)


class Served:
    """A started host with round 1 open for clusters 0 and 1, plus a pristine copy of its head/optimizer."""

    def __init__(
        self,
        head: nn.Module,
        max_message_mb: int = 256,
        hidden: int = H,
        transport: str = "grpc",
        tls: tuple[bytes, bytes] | None = None,
        optimizer: type[torch.optim.Optimizer] = torch.optim.Adam,
        **spec_kw,
    ) -> None:
        torch.manual_seed(0)
        self.transport = transport  # dataplane.transport of the host and, by default, of its clients
        self.head = head
        self.optimizer = optimizer(head.parameters(), lr=1e-2)
        self.ref_head = copy.deepcopy(head)
        self.ref_optimizer = optimizer(self.ref_head.parameters(), lr=1e-2)
        spec = DecoderHostSpec(
            hidden_size=hidden,
            bind="127.0.0.1",
            port=0,
            max_message_mb=max_message_mb,
            transport=transport,
            **spec_kw,
        )
        self.host = DecoderHost(head, self.optimizer, SECRET, spec, tls=tls)
        self.host.start()
        self.host.open_round(1, [0, 1])
        self._clients: dict[tuple[int, int], list[DecoderClient]] = {}

    def client(self, cluster: int = 0, **kw) -> DecoderClient:
        """A CU's client with its own key; a fresh client of the same (round, cluster) continues its step ids."""
        round_ = kw.get("round", 1)
        earlier = self._clients.setdefault((round_, cluster), [])
        kw = {
            "secret": cluster_key(SECRET, round_, cluster),
            "round": round_,
            "cluster": cluster,
            "timeout_s": 30,
            "start_seq": max((c._seq for c in earlier), default=0),
            "transport": self.transport,
            **kw,
        }
        spec_keys = {f.name for f in dataclasses.fields(DecoderClientSpec)}  # the rest are DecoderClient's own
        spec = DecoderClientSpec(**{k: v for k, v in kw.items() if k in spec_keys})
        client = DecoderClient(self.host.address, spec=spec, **{k: v for k, v in kw.items() if k not in spec_keys})
        earlier.append(client)
        return client


MAX_LEN, MAX_ABS = 16, 1e4  # the served decoder's positions and activation limit (make_step: t = 7, |z| ~ 10)


@pytest.fixture(params=TRANSPORTS)
def transport(request) -> str:
    """dataplane.transport, for the tests that hold over both (they name this fixture)."""
    return request.param


@pytest.fixture
def served(request):
    """A served host over gRPC, or over each transport in turn when the test also names ``transport``."""
    transport = request.getfixturevalue("transport") if "transport" in request.fixturenames else "grpc"
    s = Served(TokenHead(), max_len=MAX_LEN, max_abs_activation=MAX_ABS, transport=transport)
    yield s
    s.host.stop(grace_s=0)


def raw_stream(address: str, round_: int = 1, cluster: int = 0, key: str | None = None):
    """A bare gRPC stream of cluster n in round t (with that CU's key in its metadata unless ``key`` is given)."""
    channel = grpc.insecure_channel(address)
    raw = channel.stream_stream(FULL_METHOD, request_serializer=None, response_deserializer=None)
    metadata = call_metadata(round_, cluster, cluster_key(SECRET, round_, cluster) if key is None else key)
    return channel, lambda requests, **kw: raw(requests, metadata=metadata, **kw)


def exchange(address: str, frame: bytes, round_: int = 1, cluster: int = 0) -> dict:
    """Send one raw frame on a fresh stream of cluster n in round t; the reply's header."""
    channel, call = raw_stream(address, round_, cluster)
    try:
        return decode_frame(list(call(iter([frame]), timeout=10))[0])[0]
    finally:
        channel.close()


def run_cus_then_stop(host: DecoderHost, cu, args: list[tuple], join_s: float) -> None:
    """``cu(*a)`` for each ``a`` of ``args`` on a thread of its own, all at once (started in that order, each joined
    for ``join_s`` at most); then the host's round closed and the host stopped."""
    threads = [threading.Thread(target=cu, args=a) for a in args]
    for th in threads:
        th.start()
    for th in threads:
        th.join(join_s)
    host.close_round()
    host.stop()
