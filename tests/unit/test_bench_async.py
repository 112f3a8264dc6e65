"""benchmarks/bench_async.py without a pipeline: the lognormal latency sampler against theory, the aggregation of
veRL's step metrics into throughput ratios and the table, the benchmark's specs as the product validates them, and
the latency proxy forwarding to a local HTTP server with the delay applied."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import async_figures as F
import bench_async as B
import latency_proxy as L
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


# -- latency ----------------------------------------------------------------------------------------------------


def test_the_sampler_draws_a_lognormal_with_the_given_median_and_sigma():
    median, sigma, n = 1.0, 1.0, 20_000
    theory = L.theory_quantiles(median, sigma)
    assert theory["p50"] == pytest.approx(1.0)
    assert theory["p90"] == pytest.approx(3.602, abs=1e-3)  # exp(1.2816)
    assert theory["p99"] == pytest.approx(10.240, abs=1e-3)  # exp(2.3263)
    a = L.sample_latencies(median, sigma, n, seed=7)
    drawn = L.empirical_quantiles(a)
    # relative standard errors at n = 20000: ~0.9 % (median), ~1.2 % (p90)
    assert drawn["p50"] == pytest.approx(theory["p50"], rel=0.04)
    assert drawn["p90"] == pytest.approx(theory["p90"], rel=0.05)
    b = L.sample_latencies(median, sigma, n, seed=8)
    assert not (a == b).all()
    assert L.empirical_quantiles(b)["p50"] == pytest.approx(1.0, rel=0.04)
    assert (L.sample_latencies(median, sigma, 50, seed=7) == a[:50]).all()  # seeded: the same draws


def test_the_quantiles_scale_with_the_median_and_a_zero_sigma_is_constant():
    assert L.lognormal_quantile(0.2, 1.0, 0.9) == pytest.approx(0.2 * L.lognormal_quantile(1.0, 1.0, 0.9))
    assert list(L.sample_latencies(0.3, 0.0, 10, seed=1)) == pytest.approx([0.3] * 10)
    with pytest.raises(ValueError):
        L.LatencySampler(0.0, 1.0, 0)
    assert L.empirical_quantiles([]) == {}


# -- aggregation and the table ------------------------------------------------------------------------------------


def _step(step_s, gen_s, stale=0.0, spans=1.0):
    return {F.STEP_S: step_s, F.GEN_S: gen_s, F.STALE: stale, F.SPANS: spans}


def test_the_figures_and_the_ratios_come_from_the_step_metrics():
    sync = F.mode_figures([_step(100, 60), _step(80, 50)], 4, [300.0], [20.0, 35.0])
    fast = F.mode_figures([_step(50, 10, 1, 2), _step(40, 5, 2, 3)], 4, [200.0], [])
    assert sync["trajectories"] == 8 and sync["steps"] == 2
    assert sync["traj_per_min_step"] == pytest.approx(8 / 3)
    assert sync["traj_per_min_wall"] == pytest.approx(8 / 5)
    assert sync["rollout_share"] == pytest.approx(110 / 180)
    assert sync["longest_conversation_s"] == 35.0 and "traces" in sync["longest_conversation_source"]
    assert fast["longest_conversation_s"] == 10 and "timing_s/gen" in fast["longest_conversation_source"]
    assert (fast["stale_max"], fast["stale_mean"], fast["spans_max"]) == (2, 1.5, 3)
    ratios = F.throughput_ratios({"sync": sync, "colocate_async": fast})
    assert ratios["colocate_async"]["traj_per_min_step"] == pytest.approx(2.0)
    assert ratios["colocate_async"]["traj_per_min_wall"] == pytest.approx(1.5)
    assert ratios["sync"]["traj_per_min_step"] == pytest.approx(1.0)
    assert F.throughput_ratios({"colocate_async": fast})["colocate_async"]["traj_per_min_step"] is None
    empty = F.mode_figures([], 4, [], [])
    assert empty["traj_per_min_step"] is None and empty["longest_conversation_s"] is None


def test_the_target_needs_the_ratio_and_a_pass_rate_not_worse_beyond_the_ci():
    assert F.target_met(1.6, (-0.2, 0.1))
    assert not F.target_met(1.4, (-0.2, 0.1))
    assert not F.target_met(2.0, (-0.3, -0.01))
    assert not F.target_met(None, (0.0, 0.1)) and not F.target_met(2.0, None)


def test_the_table_shows_the_modes_as_columns():
    sync = F.mode_figures([_step(100, 60)], 4, [120.0], [30.0])
    fast = F.mode_figures([_step(50, 10, 1, 2)], 4, [60.0], [12.0])
    figures = {"sync": {**sync, "runs": 1, "runs_ok": 1, "run_wall_s": 600.0, "pass1_first": 0.5, "pass1_last": 0.6}}
    figures["colocate_async"] = {**fast, "runs": 1, "runs_ok": 1, "run_wall_s": 300.0}
    paired = {"colocate_async": {"diff": -0.1, "ci": [-0.3, 0.1], "p": 0.5, "tasks": 12, "seeds": 1}}
    text = F.format_table(list(figures), F.table_rows(figures, F.throughput_ratios(figures), paired))
    lines = text.splitlines()
    assert lines[0].split() == ["sync", "colocate_async"]
    assert "2.00×" in text and "-0.100 [-0.300, +0.100]" in text and "(base)" in text
    assert len({len(line) for line in lines[2:]}) == 1  # aligned columns


# -- the benchmark's specs, validated by the product --------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_the_run_spec_is_a_valid_spec_with_the_mode_and_the_proxied_simulator(mode):
    from longhaul.spec.load import parse_spec_text

    demo = yaml.safe_load((ROOT / "specs" / "demo.yaml").read_text())
    doc = F.run_spec(F.shrink(demo), mode, seed=3, steps=2, warmup_batches=1.5, simulator_url="http://127.0.0.1:9/v1")
    exp = parse_spec_text(yaml.safe_dump(doc), "bench.yaml")
    s = exp.spec
    assert (s.algorithm.seed, s.algorithm.total_steps, s.algorithm.save_freq) == (3, 2, 2)
    assert str(s.algorithm.trainer.mode) == mode
    assert s.algorithm.trainer.warmup_batches == (1.5 if mode != "sync" else 1.0)
    assert s.evaluation.checkpoints == [0, 2] and s.evaluation.samples_per_task == 1
    assert str(s.user_simulator.placement) == "external" and s.user_simulator.url == "http://127.0.0.1:9/v1"
    assert (s.algorithm.train_batch_size, s.algorithm.group_size, s.environment.max_turns) == (2, 2, 3)
    assert demo["spec"]["algorithm"].get("trainer") is None  # the spec read is left as it was


def test_the_simulator_server_comes_from_the_launch_plan():
    from longhaul.render.plan import VLLM_SERVER_MODULE, render_plan
    from longhaul.spec.load import parse_spec_text

    demo = yaml.safe_load((ROOT / "specs" / "demo.yaml").read_text())
    exp = parse_spec_text(yaml.safe_dump(F.simulator_spec(demo, 18765)), "sim.yaml")
    server = render_plan(exp, "local", "/tmp/x", server_python="py").simulator
    assert server is not None and server.port == 18765 and server.argv[:3] == ("py", "-m", VLLM_SERVER_MODULE)
    model = server.argv[server.argv.index("--model") + 1]
    assert Path(model).is_absolute() and model.endswith("tiny-user")


def test_separate_async_is_left_out_with_the_specs_own_refusal():
    """On the CPU demo spec the benchmark prints the product's one-line refusal (and runs sync and
    colocate_async only); on a GPU spec it has nothing to say."""
    demo = yaml.safe_load((ROOT / "specs" / "demo.yaml").read_text())
    refusal = B.separate_async_refusal(demo)
    assert refusal.startswith("separate_async: not run") and "refuses 'naive'" in refusal, refusal
    assert "\n" not in refusal
    gpu = yaml.safe_load((ROOT / "specs" / "demo.yaml").read_text())
    gpu["spec"]["resources"]["gpus_per_node"] = 2
    gpu["spec"]["policy"]["lora"] = {"rank": 0}
    assert B.separate_async_refusal(gpu) == ""


# -- the proxy ----------------------------------------------------------------------------------------------------


class _Echo(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        out = json.dumps({"path": self.path, "got": body.decode(), "auth": self.headers.get("Authorization")})
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Upstream", "echo")
        self.end_headers()
        self.wfile.write(out.encode())

    def do_GET(self):  # noqa: N802
        self.send_response(404 if self.path != "/v1/models" else 200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(f"GET {self.path}".encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_proxy_forwards_unchanged_after_the_delay(upstream):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "héllo"}]}).encode()
    with L.LatencyProxy(upstream, L.LatencySampler(0.05, 0.5, seed=3)) as proxy:
        req = urllib.request.Request(
            proxy.base_url + "/v1/chat/completions?x=1",
            data=body,
            headers={"Content-Type": "application/json", "Authorization": "Bearer k"},
        )
        t0 = time.monotonic()
        with urllib.request.urlopen(req, timeout=10) as r:
            took = time.monotonic() - t0
            status, headers, answer = r.status, r.headers, json.loads(r.read())
        with urllib.request.urlopen(proxy.base_url + "/v1/models", timeout=10) as r:
            assert (r.status, r.read()) == (200, b"GET /v1/models")
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(proxy.base_url + "/nope", timeout=10)
        assert missing.value.code == 404
        delays = list(proxy.delays)
    assert status == 201 and headers["X-Upstream"] == "echo" and headers["Content-Type"] == "application/json"
    assert answer == {"path": "/v1/chat/completions?x=1", "got": body.decode(), "auth": "Bearer k"}
    assert len(delays) == 3 and delays == list(L.sample_latencies(0.05, 0.5, 3, seed=3))
    assert took >= delays[0]
