"""`rlvr serve --engine hf`: the same samples as the in-process engine, stop strings and budgets per
request, weight sync (gloo pair group, a shared folder, LoRA adapter only) with versions, a sync cut
midway changing nothing, and the token rules."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
import torch

from rlvr.dist import Dist
from rlvr.dist.transfer import TensorMeta, WeightSender, free_port
from rlvr.models.loading import load_model, load_tokenizer
from rlvr.rollout.engines.hf import HFEngine
from rlvr.rollout.engines.protocols import SamplingParams
from rlvr.rollout.engines.remote.client import RlvrServerClient
from rlvr.rollout.engines.remote.engine import RemoteEngine
from rlvr.rollout.engines.remote.pool import ServerPool
from rlvr.rollout.engines.remote.protocol import GenerateRequest
from rlvr.serve.hf_backend import HFBackend

from _servers import Server, start_servers

PROMPTS = ["12+7=", "3*4=", "100-1="]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    (s,) = start_servers(tiny_model_dir, 1)
    yield s
    s.kill()


@pytest.fixture
def local(tiny_model_dir):
    tok, _ = load_tokenizer(tiny_model_dir)
    return load_model(tiny_model_dir), tok


def _ids(tok, prompts):
    return [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]


@pytest.mark.parametrize("min_p, penalty", [(0.0, 1.0), (0.2, 1.0), (0.0, 1.5)])
def test_generate_is_the_in_process_engine(server, local, min_p, penalty):
    model, tok = local
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=6, min_p=min_p, repetition_penalty=penalty)
    torch.set_num_threads(1)
    gen = HFEngine(model, tok).generate(PROMPTS, params, [5, 6, 7])
    client = RlvrServerClient(server.url)
    request = GenerateRequest(_ids(tok, PROMPTS), 3, [5, 6, 7], [6, 6, 6], entropy=True, min_p=min_p, repetition_penalty=penalty)
    result = client.generate(request)
    assert result.version == 0 and len(result.samples) == 3
    for r, s in enumerate(x for per in result.samples for x in per):
        keep = gen.completion_mask[r].bool()
        assert s.ids == gen.completion_ids[r][keep].tolist()
        assert s.logprobs == gen.sampling_logprobs[r][keep].tolist()  # the same code on the same ids: bit for bit
        assert s.entropy == gen.sampling_entropy[r][keep].tolist()
        assert s.finish == ("length" if gen.truncated[r] else "stop")


def test_turn_requests_end_at_a_stop_string_or_their_own_budget(server, local):
    _, tok = local
    client = RlvrServerClient(server.url)
    budgets = [2, 5, 9]
    result = client.generate(GenerateRequest(_ids(tok, PROMPTS), 4, [1, 2, 3], budgets, stop_strings=["1", "2"]))
    finishes = set()
    for per, budget in zip(result.samples, budgets):
        for s in per:
            text = tok.decode(s.ids)
            assert len(s.ids) <= budget
            finishes.add(s.finish)
            if s.finish == "length":
                assert len(s.ids) == budget and not any(x in tok.decode(s.ids[:-1]) for x in "12")
            else:  # EOS, or the first stop string: nothing sampled after it
                assert s.ids[-1] == tok.eos_token_id or any(x in text for x in "12")
                assert not any(x in tok.decode(s.ids[:-1]) for x in "12")
    assert finishes == {"stop", "length"}  # both ways of ending happened


def _perturbed(model, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def _remote(model, tok, url, version, **kw) -> RemoteEngine:
    return RemoteEngine(model, tok, ServerPool([RlvrServerClient(url)]), dist=Dist(), version_of=lambda: version[0], **kw)


@pytest.mark.parametrize("sync", ["distributed", "filesystem"])
def test_weight_sync_makes_the_server_sample_the_trainers_weights(server, local, tmp_path, sync):
    model, tok = local
    _perturbed(model)
    version = [7]
    engine = _remote(model, tok, server.url, version, weight_sync=sync, weight_dir=str(tmp_path / "w"))
    engine.sync_weights()
    assert server.health()["version"] == 7 and engine.version == 7
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=5)
    torch.set_num_threads(1)
    mine = HFEngine(model, tok).generate(PROMPTS, params, [3, 4, 5])
    theirs = engine.generate(PROMPTS, params, [3, 4, 5])
    assert torch.equal(theirs.completion_ids, mine.completion_ids)
    # the same weights: log-probs to fp32 rounding (bit-equal on AMD EPYC; on an Intel Xeon the server process's
    # kernels round differently by ~1e-7); stale weights would differ by the perturbation, orders of magnitude more
    torch.testing.assert_close(theirs.sampling_logprobs, mine.sampling_logprobs, rtol=0, atol=1e-5)
    assert theirs.versions.tolist() == [7] * 6
    stats = engine.take_sync_stats()
    assert stats.syncs == 1 and stats.bytes >= sum(p.numel() * 4 for p in model.parameters())
    if sync == "filesystem":
        assert [p.name for p in (tmp_path / "w").iterdir()] == ["v0000007"]
    version[0] = 8
    engine.sync_weights()
    assert server.health()["version"] == 8


@pytest.mark.parametrize("sync", ["distributed", "filesystem"])
def test_lora_sync_moves_only_the_adapter(tiny_model_dir, local, tmp_path, sync):
    from peft import LoraConfig, get_peft_model

    (server,) = start_servers(tiny_model_dir, 1)  # its own: the base weights must be the model's (only the adapter moves)
    model, tok = local
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # B = 0 at init would make the adapter a no-op
    engine = _remote(peft, tok, server.url, [1], weight_sync=sync, weight_dir=str(tmp_path / "w"))
    engine.sync_weights()
    adapter = sum(p.numel() * 4 for n, p in peft.named_parameters() if "lora_" in n)
    sent = engine.take_sync_stats().bytes  # the adapter, not the base weights (a file adds its header)
    assert sent == adapter if sync == "distributed" else adapter < sent < adapter + 8192
    assert server.health()["lora"] is True
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=5)
    torch.set_num_threads(1)
    mine = HFEngine(peft, tok).generate(PROMPTS, params, [9, 8, 7])
    theirs = engine.generate(PROMPTS, params, [9, 8, 7])
    server.kill()
    assert torch.equal(theirs.completion_ids, mine.completion_ids)
    assert torch.equal(theirs.sampling_logprobs, mine.sampling_logprobs)


def test_a_sync_cut_midway_leaves_the_old_weights_and_version(local):
    model, tok = local
    backend = HFBackend(model, tok, name="tiny", timeout=3.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    port = free_port()
    joined = threading.Thread(target=backend.init_weight_transfer, args=("127.0.0.1", port, "gloo", None))
    joined.start()
    sender = WeightSender("127.0.0.1", port, timeout=3.0)
    joined.join()
    # the first tensor in float64: a bucket of its own (buckets hold one dtype), the rest in a second one
    tensors = [(n, p.detach().double() + 1.0 if i == 0 else p.detach() + 1.0) for i, (n, p) in enumerate(model.named_parameters())]
    metas = [TensorMeta.of(n, t) for n, t in tensors]
    errors: list[Exception] = []
    receiving = threading.Thread(target=lambda: _catch(errors, backend.update_weights, 1, metas))
    receiving.start()
    sender.broadcast(tensors[0][1].reshape(-1).clone())  # the first bucket, whole...
    receiving.join(timeout=30)  # ...then nothing: the receiver times out waiting for the second
    assert not receiving.is_alive() and len(errors) == 1 and backend.version == 0
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n


def test_health_reports_the_incoming_version_while_its_weights_are_copied_in(local, tmp_path):
    """The swap takes the staged weights, then copies them in: health() in between says the incoming version (the one
    the next request is sampled under), not the one it replaces (a race CI once hit: version 8 read as the old 8 after
    a sync to 7). Checked from inside the copy."""
    from safetensors.torch import save_file

    model, tok = local
    backend = HFBackend(model, tok, name="tiny", timeout=3.0)
    save_file({n: p.detach().clone() for n, p in model.named_parameters()}, str(tmp_path / "weights.safetensors"))
    seen = []
    params_by_name = backend._params_by_name

    def copying():  # called by the swap after it took the staged weights, before the first copy
        seen.append(backend.health()["version"])
        return params_by_name()

    backend._params_by_name = copying
    for version in (8, 7):
        backend.load_weights(version, str(tmp_path))  # staged; swapped in at once (no batch is being generated)
        assert backend.version == version and backend.health()["version"] == version
    # per sync, the check of the names (before staging: the live version), then the swap (the incoming one); before the
    # fix the swap's read gave the version it replaced: [0, 0, 8, 8]
    assert seen == [0, 8, 8, 7]


def _catch(errors, fn, *args):
    try:
        fn(*args)
    except Exception as e:  # the test asserts on it
        errors.append(e)


def test_non_loopback_needs_a_token(tiny_model_dir):
    r = subprocess.run(
        [sys.executable, "-m", "rlvr", "serve", tiny_model_dir, "--host", "0.0.0.0", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
    )
    assert r.returncode == 2 and "--host 0.0.0.0: binding an address other than 127.0.0.1 needs a token" in r.stderr


def test_with_a_token_every_request_but_health_needs_it(tiny_model_dir):
    s = Server(tiny_model_dir, "--api-key", "s3cret", host="0.0.0.0").wait()
    try:
        assert s.health()["engine"] == "hf"  # open: waits and load balancers
        body = json.dumps({"prompt_ids": [[5, 6]], "n": 1, "seeds": [1], "max_tokens": [2]}).encode()
        for path in ("/generate", "/update_weights", "/init_weight_transfer", "/load_weights"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(urllib.request.Request(s.url + path, data=body, method="POST"), timeout=10)
            assert e.value.code == 401, path
        wrong = urllib.request.Request(s.url + "/generate", data=body, method="POST", headers={"Authorization": "Bearer nope"})
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(wrong, timeout=10)
        assert RlvrServerClient(s.url, token="s3cret").generate(GenerateRequest.from_json(json.loads(body))).version == 0
    finally:
        s.kill()


def test_a_taken_port_is_a_clear_error(server, tiny_model_dir):
    r = subprocess.run(
        [sys.executable, "-m", "rlvr", "serve", tiny_model_dir, "--port", str(server.port)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and f"rlvr serve: cannot listen on 127.0.0.1:{server.port}: Address already in use" in r.stderr


def test_a_trainer_whose_server_does_not_answer_says_which(make_trainer):
    from rlvr.config import ConfigError

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError, match=rf"rollout.servers: generation server {url}: /health failed: .*Connection refused"):
        make_trainer(f"rollout.servers=[{url}]", "rollout.server_timeout_s=1")
