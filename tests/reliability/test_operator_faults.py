"""The operator under faults, with figures for the reliability report (area "operator").

1. SIGKILL at seeded random moments while the real operator (`kopf run`, started as the e2e harness starts it)
   reconciles single- and multi-seed Experiments that the test advances by playing the Job controller; after
   every restart: no duplicate Jobs/ConfigMaps, the status converges to what the objects say, nothing half-done.
   In-process companion: a crash after the N-th API call of `reconcile_experiment`, for every N, then a
   reconcile from the stored state.
2. API-server faults injected by the test API server (tests/support/kube_emulator, `faults.py`): 409, 410 on
   watches, 429 with Retry-After, 500/503, request timeouts and reset connections, dropped watch streams → the
   operator retries with back-off and converges (without the periodic re-sync: it is set to 300 s here).
3. Two operator replicas at once (an unsupported set-up: the chart runs exactly one, see operator/README.md):
   both act, and deterministic names + 409-adopt still leave no duplicates; the chart refuses replicaCount > 1.

Seed: $LONGHAUL_RELIABILITY_SEED (default 15); trials: $LONGHAUL_RELIABILITY_KILL_TRIALS (default 50).
"""

from __future__ import annotations

import collections
import copy
import functools
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests/e2e/k8s"))
sys.path.insert(0, str(ROOT / "tests/support"))

import k8s_harness as H  # noqa: E402

from longhaul import constants as C  # noqa: E402
from longhaul.spec import build_experiment, run_name, seed_runs  # noqa: E402
from support.net import free_port, wait_http  # noqa: E402

AREA = "operator"
SEED = int(os.environ.get("LONGHAUL_RELIABILITY_SEED", "15"))
KILL_TRIALS = int(os.environ.get("LONGHAUL_RELIABILITY_KILL_TRIALS", "50"))
SMOKE = yaml.safe_load((ROOT / "specs/smoke.yaml").read_text())
STAGES = ("grpo", "eval")
EXP_API = f"/apis/{C.API_GROUP}/{C.API_VERSION}"
Record = Callable[..., None]
TEST_AGENT = "longhaul-reliability-test"


# ---------------------------------------------------------------------------------------------------------------
# What the objects say: the expected children and status of an Experiment, computed from its Jobs


@dataclass(frozen=True)
class Exp:
    """An Experiment the test applied: smoke.yaml under `name`, with `seeds` (a group) or `seed: 7`."""

    name: str
    seeds: tuple[int, ...] | None = None

    @property
    def doc(self) -> dict[str, Any]:
        doc = copy.deepcopy(SMOKE)
        doc["metadata"] = {"name": self.name}
        if self.seeds:
            del doc["spec"]["algorithm"]["seed"]
            doc["spec"]["algorithm"]["seeds"] = list(self.seeds)
        return doc

    @property
    def run(self) -> str:
        return _names(self)[0]

    def chains(self) -> list[tuple[int | None, str]]:
        """(seed, run name) of each stage chain: one for a single run, one per seed for a group."""
        return list(_names(self)[1])


@functools.cache
def _names(exp: Exp) -> tuple[str, tuple[tuple[int | None, str], ...]]:
    """The run name of `exp` and its chains', as `longhaul submit` computes them."""
    built = build_experiment(exp.doc, file=exp.name)
    if not exp.seeds:
        return run_name(built), ((None, run_name(built)),)
    return run_name(built), tuple((r.spec.algorithm.seed, run_name(r)) for r in seed_runs(built))


def job_phase(job: dict[str, Any] | None) -> str | None:
    """The phase of a Job as the tests set it (the harness's job_running/job_succeeded/job_failed)."""
    if job is None:
        return None
    st = job.get("status") or {}
    conds = {c["type"] for c in st.get("conditions") or [] if c.get("status") == "True"}
    if conds & {"Failed", "FailureTarget"}:
        return "Failed"
    if conds & {"Complete", "SuccessCriteriaMet"}:
        return "Succeeded"
    return "Running" if int(st.get("ready") or 0) > 0 else "Pending"


@dataclass
class Verdict:
    """An Experiment compared with what its objects say."""

    problems: list[str] = field(default_factory=list)  # anything not (yet) as it should be
    extra: int = 0  # children that must not exist: duplicates, premature stages (never fixed by waiting)
    missing: int = 0  # children that should exist and do not (yet)
    phase: str | None = None  # the expected phase
    active_jobs: list[tuple[str, str]] = field(default_factory=list)  # (job, phase) that are not finished

    @property
    def ok(self) -> bool:
        return not self.problems


def judge(exp: Exp, body: dict[str, Any] | None, jobs: list[dict[str, Any]], cms: list[dict[str, Any]]) -> Verdict:
    """Compare an Experiment (`body`) and its children (`jobs`, `cms`: those labelled with its name) with the
    rules: per chain a ConfigMap `<run>-spec` and the stages in order, each only after the previous succeeded;
    the status (phase, stage, jobName, runName; for a group SEEDS and seedRuns) as the Jobs say."""
    v = Verdict()
    if body is None:
        v.problems.append(f"{exp.name}: gone")
        return v
    uid = body["metadata"]["uid"]
    by_name = {j["metadata"]["name"]: j for j in jobs}
    wanted_jobs: set[str] = set()
    unexpected: set[str] = set()
    chains = []
    for seed, run in exp.chains():
        phases: list[str | None] = []
        for stage in STAGES:
            name = f"{run}-{stage}"
            wanted_jobs.add(name)
            phases.append(job_phase(by_name.get(name)))
            if phases[-1] != "Succeeded":
                break
        if "Failed" in phases:
            stage = STAGES[phases.index("Failed")]
            phase = "Failed"
        elif len(phases) == len(STAGES) and all(p == "Succeeded" for p in phases):
            stage, phase = STAGES[-1], "Succeeded"
        else:
            stage = STAGES[len(phases) - 1]
            phase = "Running" if "Running" in phases else "Pending"
        for name, p in zip((f"{run}-{s}" for s in STAGES), phases, strict=False):
            if p in ("Pending", "Running"):
                v.active_jobs.append((name, p))
        chains.append((seed, run, phase, stage))
        # Counted per run label: exactly the allowed Jobs and one ConfigMap carry it.
        labelled = {
            o["metadata"]["name"] for o in [*jobs, *cms] if o["metadata"]["labels"].get(C.LABEL_RUN_NAME) == run
        }
        allowed = {f"{run}-{s}" for s in STAGES[: len(phases)]} | {f"{run}-spec"}
        unexpected.update(labelled - allowed)
        if f"{run}-spec" not in {c["metadata"]["name"] for c in cms}:
            v.missing += 1
            v.problems.append(f"{exp.name}: ConfigMap {run}-spec missing")
    spec_names = {f"{r}-spec" for _, r in exp.chains()}
    # Objects the rules do not allow (a duplicate, an eval before its grpo succeeded, anything unknown): each once.
    unexpected.update(n for n in by_name if n not in wanted_jobs)
    unexpected.update(c["metadata"]["name"] for c in cms if c["metadata"]["name"] not in spec_names)
    v.extra = len(unexpected)
    v.problems += [f"{exp.name}: unexpected {n}" for n in sorted(unexpected)]
    for name in wanted_jobs - set(by_name):
        v.missing += 1
        v.problems.append(f"{exp.name}: Job {name} missing")
    for child in [*jobs, *cms]:
        refs = child["metadata"].get("ownerReferences") or []
        if [(r.get("kind"), r.get("uid"), r.get("controller")) for r in refs] != [(C.KIND, uid, True)]:
            v.problems.append(f"{exp.name}: {child['metadata']['name']} not owned by its Experiment: {refs}")
    st = body.get("status") or {}
    if exp.seeds:
        found = {p for *_, p, _ in chains}
        v.phase = next((p for p in ("Running", "Pending", "Failed") if p in found), "Succeeded")
        want = {
            "runName": exp.run,
            "phase": v.phase,
            "seeds": f"{sum(1 for *_, p, _ in chains if p == 'Succeeded')}/{len(chains)}",
            "seedRuns": [(seed, run, p, s) for seed, run, p, s in chains],
        }
        got = {
            "runName": st.get("runName"),
            "phase": st.get("phase"),
            "seeds": st.get("seeds"),
            "seedRuns": [
                (e.get("seed"), e.get("runName"), e.get("phase"), e.get("stage")) for e in st.get("seedRuns") or []
            ],
        }
    else:
        ((_, run, phase, stage),) = chains
        v.phase = phase
        want = {"runName": run, "phase": phase, "stage": stage, "jobName": f"{run}-{stage}"}
        got = {k: st.get(k) for k in want}
    if got != want:
        v.problems.append(f"{exp.name}: status {got} != {want}")
    return v


# ---------------------------------------------------------------------------------------------------------------
# The test API server with its fault control, read over HTTP (fast polling; kubectl for what users do)


class Emulator:
    """The emulator process's API (from the kubeconfig) and its fault-injection control endpoint."""

    def __init__(self, cluster: H.Cluster) -> None:
        self.cluster = cluster
        server = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        # The test's own requests (and kubectl's) are never faulted: the operator suffers, the test acts and looks.
        self.http = httpx.Client(base_url=server, timeout=30, headers={"User-Agent": TEST_AGENT})
        self.faults(exempt_agents=["kubectl", TEST_AGENT])

    def faults(self, **doc: Any) -> dict[str, Any]:
        resp = self.http.put("/emulator/faults", json=doc)
        resp.raise_for_status()
        return resp.json()

    def state(self) -> dict[str, Any]:
        return self.http.get("/emulator/faults").raise_for_status().json()

    def items(self, path: str, selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": selector} if selector else None
        return self.http.get(path, params=params).raise_for_status().json()["items"]

    def snapshot(self, ns: str) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        exps = {e["metadata"]["name"]: e for e in self.items(f"{EXP_API}/namespaces/{ns}/experiments")}
        jobs = self.items(f"/apis/batch/v1/namespaces/{ns}/jobs")
        cms = self.items(f"/api/v1/namespaces/{ns}/configmaps", "app.kubernetes.io/component=spec")
        return exps, jobs, cms

    def judge_all(self, ns: str, exps: list[Exp]) -> dict[str, Verdict]:
        bodies, jobs, cms = self.snapshot(ns)

        def mine(objs: list[dict[str, Any]], e: Exp) -> list[dict[str, Any]]:
            return [o for o in objs if o["metadata"]["labels"].get(C.LABEL_EXPERIMENT) == e.name]

        return {e.name: judge(e, bodies.get(e.name), mine(jobs, e), mine(cms, e)) for e in exps}

    def delete_experiment(self, ns: str, name: str) -> None:
        self.http.delete(f"{EXP_API}/namespaces/{ns}/experiments/{name}")


def _describe(emu: Emulator, ns: str) -> dict[str, Any]:
    """What is stored, in short (for failure messages)."""
    exps, jobs, cms = emu.snapshot(ns)
    return {
        "experiments": {
            n: {k: (e.get("status") or {}).get(k) for k in ("phase", "runName", "stage", "seeds")}
            for n, e in exps.items()
        },
        "jobs": {
            j["metadata"]["name"]: [
                j["metadata"]["labels"].get(C.LABEL_EXPERIMENT),
                job_phase(j),
                j["metadata"].get("creationTimestamp"),
            ]
            for j in jobs
        },
        "configmaps": [c["metadata"]["name"] for c in cms],
    }


def apply(cluster: H.Cluster, ns: str, exps: list[Exp]) -> None:
    docs = "---\n".join(yaml.safe_dump(e.doc) for e in exps)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=docs)


def new_namespace(cluster: H.Cluster, name: str) -> str:
    manifest = cluster.kubectl("create", "namespace", name, "--dry-run=client", "-o", "json").stdout
    cluster.kubectl("apply", "-f", "-", input=manifest)
    return name


def converge(emu: Emulator, ns: str, exps: list[Exp], timeout: float = 45) -> tuple[bool, float, dict[str, Verdict]]:
    """Poll until every Experiment matches what its objects say; (converged, seconds, last verdicts)."""
    t0 = time.monotonic()
    verdicts: dict[str, Verdict] = {}
    while time.monotonic() - t0 < timeout:
        verdicts = emu.judge_all(ns, exps)
        if all(v.ok for v in verdicts.values()):
            return True, time.monotonic() - t0, verdicts
        time.sleep(0.1)
    return False, time.monotonic() - t0, verdicts


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """The test API server as a process (fault injection on), the chart's CRD applied."""
    workdir = tmp_path_factory.mktemp("k8s-faults")
    port, log, kubeconfig = free_port(), workdir / "emulator.log", workdir / "kubeconfig"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(H.EMULATOR), "--port", str(port), "--kubeconfig", str(kubeconfig)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/version", 60, proc=proc, log=log)
        cluster = H.Cluster(kubeconfig=kubeconfig, emulated=True, workdir=workdir)
        cluster.kubectl("apply", "-f", str(H.CRD_FILE))
        cluster.kubectl("wait", "--for=condition=Established", "crd/experiments.longhaul.dev", "--timeout=60s")
        e = Emulator(cluster)
        yield e
        e.http.close()
    finally:
        H.stop(proc)


# ---------------------------------------------------------------------------------------------------------------
# 1. SIGKILL at random moments of reconcile


def _next_action(rng: random.Random, verdicts: dict[str, Verdict], counter: list[int]) -> tuple[str, Any]:
    """The test's next move on a converged state: apply an Experiment, or move one Job (the Job controller)."""
    active = [(n, v) for n, v in verdicts.items() if v.active_jobs]
    if len(active) < 2 or rng.random() < 0.12:
        counter[0] += 1
        seeds = (1, 2) if counter[0] % 2 == 0 else None
        return "apply", Exp(f"k-{counter[0]:02d}", seeds)
    _, v = rng.choice(active)
    job, phase = rng.choice(v.active_jobs)
    r = rng.random()
    if phase == "Pending":
        move = "running" if r < 0.6 else "succeeded" if r < 0.92 else "failed"
    else:
        move = "succeeded" if r < 0.88 else "failed"
    return move, job


@pytest.mark.k8s
def test_sigkill_at_random_moments_of_reconcile(emu: Emulator, tmp_path: Path, reliability: Record) -> None:
    """≥ 50 seeded SIGKILLs of `kopf run` while it reconciles; after each restart everything converges."""
    rng = random.Random(SEED)
    cluster = emu.cluster
    ns = new_namespace(cluster, "lh-kill")
    # Slow writes widen the reconcile (POST Job/ConfigMap answered after the write), so kills land inside it.
    emu.faults(rules=[], delays={"POST:jobs": 0.3, "POST:configmaps": 0.2, "PATCH:experiments": 0.1}, reset_counts=True)
    op = H.WarmOperator(cluster, ns, tmp_path)
    exps: dict[str, Exp] = {}
    counter = [0]
    trials: list[dict[str, Any]] = []
    kills = duplicates = 0
    t_start = time.monotonic()
    try:
        op.start()
        first = [Exp("k-00"), Exp("k-01", (1, 2))]
        counter[0] = 1
        exps.update({e.name: e for e in first})
        apply(cluster, ns, first)
        ok, _, verdicts = converge(emu, ns, list(exps.values()))
        assert ok, verdicts
        for trial in range(KILL_TRIALS):
            # Housekeeping: finished Experiments go (garbage collection removes their children).
            for name, v in list(verdicts.items()):
                if not v.active_jobs and v.phase in ("Succeeded", "Failed") and rng.random() < 0.7:
                    emu.delete_experiment(ns, name)
                    del exps[name], verdicts[name]
            during_restart = rng.random() < 0.2
            move, arg = _next_action(rng, verdicts, counter)
            t0 = time.monotonic()
            if move == "apply":
                exps[arg.name] = arg
                apply(cluster, ns, [arg])
            else:
                {"running": H.job_running, "succeeded": H.job_succeeded, "failed": H.job_failed}[move](cluster, ns, arg)
            before = sum(emu.state()["answers"].values())
            t_action = time.monotonic() - t0
            time.sleep(rng.uniform(0, 0.6))
            op.kill()
            kills += 1
            requests = sum(emu.state()["answers"].values()) - before
            at_kill = emu.judge_all(ns, list(exps.values()))
            pending = not all(v.ok for v in at_kill.values())
            where = "mid-reconcile" if pending and requests else "before reconcile" if pending else "after reconcile"
            if during_restart:
                # Also kill the next process while it starts and resumes every Experiment.
                op.start(wait=False)
                time.sleep(rng.uniform(0.2, 2.0))
                op.kill()
                kills += 1
            op.start(wait=False)
            ok, secs, verdicts = converge(emu, ns, list(exps.values()))
            extra = sum(v.extra for v in verdicts.values())
            duplicates += extra
            trials.append(
                {
                    "trial": trial,
                    "move": move if move == "apply" else f"{move} {arg}",
                    "where": where,
                    "kills": 2 if during_restart else 1,
                    "converged": ok,
                    "seconds": round(secs, 2),
                    "action_s": round(t_action, 2),
                    "total_s": round(time.monotonic() - t0, 2),
                    "extra": extra,
                    "problems": [p for v in verdicts.values() for p in v.problems],
                }
            )
            if os.environ.get("LONGHAUL_RELIABILITY_VERBOSE"):
                print(json.dumps(trials[-1]), flush=True)
            if not ok or extra:
                trials[-1]["snapshot"] = _describe(emu, ns)
                break
    finally:
        op.stop()
    survived = sum(t["kills"] for t in trials if t["converged"] and not t["extra"])
    reliability(
        AREA,
        "SIGKILL of kopf run during reconcile (seeded)",
        injected=kills,
        survived=survived,
        lost=duplicates,
        lost_what="duplicate Jobs/ConfigMaps",
    )
    where = collections.Counter(t["where"] for t in trials)
    moves = collections.Counter(t["move"].split()[0] for t in trials)
    print(
        f"\nseed {SEED}: {len(trials)} trials, {kills} SIGKILLs in {time.monotonic() - t_start:.0f} s; kill points "
        f"{dict(where)}; moves {dict(moves)}; slowest convergence {max(t['seconds'] for t in trials)} s"
    )
    failed = [t for t in trials if not t["converged"] or t["extra"]]
    assert not failed, f"seed {SEED}: {json.dumps(failed, indent=1)}\n{op.logs()[-4000:]}"
    assert len(trials) >= KILL_TRIALS and duplicates == 0
    # The kills did hit running reconciles (the operator had sent requests and its work was unfinished).
    assert where["mid-reconcile"] >= KILL_TRIALS // 10, dict(where)


# ---------------------------------------------------------------------------------------------------------------
# 1b. In-process: crash after the N-th API call of reconcile_experiment, for every N


class Crash(Exception):
    """The process died."""


class CrashingApi:
    """Passes the first `after` calls to `api`; call number after+1 kills the "process": it is not sent
    (`lose_answer=False`) or sent with its answer lost (`lose_answer=True`); every later call fails too."""

    def __init__(self, api: Any, after: int, lose_answer: bool) -> None:
        self.api, self.after, self.lose_answer = api, after, lose_answer
        self.calls, self.dead = 0, False

    def __getattr__(self, name: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                raise Crash()
            if self.calls == self.after:
                self.dead = True
                if self.lose_answer:
                    await getattr(self.api, name)(*args, **kwargs)
                raise Crash()
            self.calls += 1
            return await getattr(self.api, name)(*args, **kwargs)

        return call


async def test_crash_after_every_api_call_of_reconcile_then_reconcile_from_stored_state(reliability: Record) -> None:
    """Every crash point of `reconcile_experiment` (before each API call, and after each one with its answer lost),
    at every step of a single and a 2-seed Experiment; a reconcile from what the server stored then converges."""
    import kmock
    from kube_emulator import KubeEmulator

    from longhaul.k8s.api import KubeApi
    from longhaul.k8s.reconcile import reconcile_experiment

    crd = yaml.safe_load(H.CRD_FILE.read_text())
    points = survived = duplicates = 0
    failures: list[str] = []
    async with KubeEmulator() as server, kmock.Server(server, host="127.0.0.1") as srv:
        client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{srv.port}", timeout=30)
        api = KubeApi(client)
        await client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)

        async def reconcile(a: Any, name: str) -> dict[str, Any]:
            fresh = await api.get(f"{C.API_GROUP}/{C.API_VERSION}", C.KIND, "ns", name)
            assert fresh is not None
            return await reconcile_experiment(a, fresh, now="2026-01-01T00:00:00Z", emit=lambda *_: None)

        def judge_stored(exp: Exp) -> Verdict:
            def mine(plural: str, group: str) -> list[dict[str, Any]]:
                return [
                    o
                    for o in server.list_objects(group, plural, "ns")
                    if (o["metadata"].get("labels") or {}).get(C.LABEL_EXPERIMENT) == exp.name
                ]

            body = server.get_object(C.API_GROUP, C.PLURAL, "ns", exp.name)
            return judge(exp, body, mine("jobs", "batch"), mine("configmaps", ""))

        def set_job(name: str, phase: str) -> None:
            job = server.store[("batch", "jobs", "ns", name)]
            job["status"] = {
                "Running": {"ready": 1, "active": 1},
                "Succeeded": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]},
                "Failed": {"failed": 1, "conditions": [{"type": "Failed", "status": "True"}]},
            }[phase]

        scenarios = [  # (Experiment, the Job changes before each reconcile step)
            (Exp("inproc-single"), [[], [("grpo", "Running")], [("grpo", "Succeeded")], [("eval", "Succeeded")]]),
            (
                Exp("inproc-seeds", (3, 4)),
                [
                    [],
                    [("s3-grpo", "Running"), ("s4-grpo", "Succeeded")],
                    [("s3-grpo", "Succeeded"), ("s4-eval", "Failed")],
                    [("s3-eval", "Succeeded")],
                ],
            ),
        ]
        for exp, steps in scenarios:
            resp = await client.post(
                f"{EXP_API}/namespaces/ns/experiments",
                json={**exp.doc, "apiVersion": f"{C.API_GROUP}/{C.API_VERSION}", "kind": C.KIND},
            )
            assert resp.status_code == 201, resp.text
            for step, changes in enumerate(steps):
                for suffix, phase in changes:
                    set_job(f"{exp.run}-{suffix}", phase)
                saved = copy.deepcopy(server.store)
                for n in range(100):
                    finished = False
                    for lose_answer in (False, True):
                        server.store = copy.deepcopy(saved)
                        crashing = CrashingApi(api, n, lose_answer)
                        try:
                            await reconcile(crashing, exp.name)
                            finished = True  # fewer than n+1 calls: every crash point of this step is done
                            break
                        except Crash:
                            points += 1
                        for _ in range(3):  # restart: reconcile from the stored state (again while not converged)
                            await reconcile(api, exp.name)
                            v = judge_stored(exp)
                            if v.ok:
                                break
                        duplicates += v.extra
                        if v.ok and not v.extra:
                            survived += 1
                        else:
                            failures.append(
                                f"{exp.name} step {step} crash before call {n + 1}"
                                f"{' (answer lost)' if lose_answer else ''}: {v.problems}"
                            )
                    if finished:
                        break
                else:
                    raise AssertionError(f"{exp.name} step {step}: more than 100 API calls in one reconcile")
                await reconcile(api, exp.name)  # the step done properly before the next one
                assert judge_stored(exp).ok, judge_stored(exp).problems
        await client.aclose()
    reliability(
        AREA,
        "crash after the N-th API call of reconcile (in-process, every N)",
        injected=points,
        survived=survived,
        lost=duplicates,
        lost_what="duplicate Jobs/ConfigMaps",
    )
    print(f"\n{points} crash points, {survived} converged, {duplicates} duplicates")
    assert not failures, "\n".join(failures[:20])
    assert points >= 50 and duplicates == 0


# ---------------------------------------------------------------------------------------------------------------
# 2. API-server faults


def test_fault_rules_parse_match_and_count() -> None:
    """The test API server's `--fault` rules (tests/support/kube_emulator/faults.py)."""
    from kube_emulator.faults import Faults, parse_rule

    rule = parse_rule("PATCH:experiments/status=409x2")
    assert (rule.method, rule.plural, rule.status, rule.count) == ("PATCH", "experiments/status", 409, 2)
    assert rule.matches("PATCH", "experiments", "status") and not rule.matches("PATCH", "experiments", None)
    assert parse_rule("post:jobs=500").matches("POST", "jobs", "status")  # a plural covers its subresources
    assert parse_rule("*:*=timeoutx1").matches("WATCH", "configmaps", None)
    for bad in ("POST:jobs", "FETCH:jobs=500", "POST:jobs=oops", "POST:jobs=500x"):
        with pytest.raises(ValueError, match="METHOD:PLURAL=FAULT"):
            parse_rule(bad)
    faults = Faults(rules=[parse_rule("GET:jobs=429x2"), parse_rule("GET:jobs=500x1")], exempt_agents=("kubectl",))
    picked = [r.fault if (r := faults.pick("GET", "jobs", None, "kopf/1.45")) else None for _ in range(5)]
    assert picked == ["429", "429", "500", None, None]
    assert faults.pick("GET", "jobs", None, "kubectl/v1.33.9") is None  # exempt, and not counted
    assert [(r.injected, r.passed) for r in faults.rules] == [(2, 2), (1, 2)]
    faults.configure({"rules": ["WATCH:jobs=410"], "drop_watches_s": 2, "reset_counts": True})
    assert faults.to_dict()["rules"][0]["remaining"] is None and faults.drop_watches_s == 2.0


@dataclass(frozen=True)
class FaultKind:
    row: str  # the report's fault column
    rules: tuple[str, ...] = ()
    drop_watches_s: float | None = None
    drop_now: bool = False  # cut the open watches at the start (the reconnects meet the WATCH rules)
    seeds: tuple[int, ...] | None = None
    #: Install the rules once the first Job exists, cut the watches, and move that Job while they are down.
    in_gap: bool = False


FAULTS = [
    FaultKind(
        "API 409 (AlreadyExists on create, Conflict on status write)",
        ("POST:jobs=409x2", "POST:configmaps=409x1", "PATCH:experiments/status=409x3"),
        seeds=(1, 2),
    ),
    # The Job watch is down (503s, kopf backs off 1 + 1 + 2 s) while the Job succeeds; the reconnect meets 410 and
    # kopf re-lists: the change arrives only in the listing (the operator must notice it; re-sync is off).
    FaultKind(
        "API 410 Gone on watch (after 503s on the reconnect; change seen only in the re-listing)",
        ("WATCH:jobs=503x3", "WATCH:jobs=410x1", "WATCH:experiments=410x2"),
        drop_now=True,
        in_gap=True,
    ),
    FaultKind(
        "API 429 Too Many Requests (Retry-After 1 s)",
        ("GET:experiments=429x3", "POST:jobs=429x2", "PATCH:experiments/status=429x2"),
    ),
    FaultKind(
        "API 500/503",
        (
            "POST:jobs=500x2",
            "POST:configmaps=503x1",
            "GET:jobs=500x2",
            "PATCH:experiments/status=503x2",
            "GET:experiments=503x1",
        ),
        seeds=(1, 2),
    ),
    FaultKind(
        "API request timeout / connection reset",
        ("POST:jobs=timeoutx1", "GET:experiments=timeoutx1", "PATCH:experiments/status=resetx2", "GET:jobs=resetx1"),
    ),
    FaultKind("dropped watch connections (every 1 s)", drop_watches_s=1.0, seeds=(1, 2)),
]


@pytest.fixture(scope="module")
def fault_operator(emu: Emulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[H.Operator, str]]:
    """One operator for the API-fault tests: a 1.5 s request timeout, and no periodic re-sync (300 s), so what
    converges does so by retries and watch events."""
    ns = new_namespace(emu.cluster, "lh-api-faults")
    op = H.Operator(emu.cluster, ns, tmp_path_factory.mktemp("fault-operator"))
    op.env = {"LONGHAUL_OPERATOR_RESYNC_S": "300", "LONGHAUL_OPERATOR_REQUEST_TIMEOUT_S": "1.5"}
    emu.faults(rules=[], delays={}, drop_watches_s=0)
    op.start()
    try:
        yield op, ns
    finally:
        op.stop()


def _drive(emu: Emulator, ns: str, exps: list[Exp], timeout: float = 45) -> tuple[dict[str, bool], list[str]]:
    """Play the Job controller through every stage of `exps` side by side (each round moves one Job of each:
    running, then succeeded), converging after each round. Returns {name: reached Succeeded} and notes."""
    cluster = emu.cluster
    ok, _, verdicts = converge(emu, ns, exps, timeout)
    notes: list[str] = []
    while ok and any(v.active_jobs for v in verdicts.values()):
        for v in verdicts.values():
            if v.active_jobs:
                job, phase = v.active_jobs[0]
                (H.job_running if phase == "Pending" else H.job_succeeded)(cluster, ns, job)
                notes.append(f"{job} {'running' if phase == 'Pending' else 'succeeded'}")
        ok, _, verdicts = converge(emu, ns, exps, timeout)
    problems = [p for v in verdicts.values() for p in v.problems]
    return {n: ok and v.phase == "Succeeded" for n, v in verdicts.items()}, problems + notes


@pytest.mark.k8s
@pytest.mark.parametrize("kind", FAULTS, ids=lambda k: k.row.split(" (")[0].replace(" ", "-"))
def test_api_server_faults_are_retried_and_converge(
    emu: Emulator, fault_operator: tuple[H.Operator, str], kind: FaultKind, reliability: Record
) -> None:
    op, ns = fault_operator
    exp = Exp(f"f-{FAULTS.index(kind)}", kind.seeds)
    log_start = len(op.logs())
    faults = {
        "rules": list(kind.rules),
        "drop_watches_s": kind.drop_watches_s or 0,
        "retry_after_s": 1,
        "hold_s": 3,
        "reset_counts": True,
        "drop_watches_now": kind.drop_now,
    }
    try:
        if not kind.in_gap:
            emu.faults(**faults)
        apply(emu.cluster, ns, [exp])
        if kind.in_gap:
            ok, _, verdicts = converge(emu, ns, [exp])
            assert ok, verdicts
            emu.faults(**faults)
            H.job_succeeded(emu.cluster, ns, verdicts[exp.name].active_jobs[0][0])
        done, notes = _drive(emu, ns, [exp])
        converged = done[exp.name]
        state = emu.state()
    finally:
        emu.faults(rules=[], drop_watches_s=0)
    verdict = emu.judge_all(ns, [exp])[exp.name]
    rules = state["rules"]
    injected = sum(r["injected"] for r in rules) + (state["dropped_watches"] if kind.drop_watches_s else 0)
    lost = verdict.extra + (0 if converged else 1)
    reliability(
        AREA,
        kind.row,
        injected=injected,
        survived=injected if converged and not verdict.extra else 0,
        lost=lost,
        lost_what="duplicate objects / unconverged Experiments",
    )
    counts = [f"{r['spec']}: {r['injected']}" for r in rules]
    if kind.drop_watches_s:
        counts.append(f"dropped watches: {state['dropped_watches']}")
    print(f"\n{kind.row}: injected {injected} ({', '.join(counts)})")
    assert converged and not verdict.extra, f"{notes}\n{json.dumps(state)[:3000]}\n{op.logs()[-5000:]}"
    # Every rule was met (the scenario exercised it), and for drops: several streams were cut.
    assert all(r["injected"] == int(r["spec"].rsplit("x", 1)[1]) for r in rules), rules
    if kind.drop_watches_s:
        assert state["dropped_watches"] >= 4
    for r in rules:
        if r["spec"].split("=")[1].startswith("429"):
            # Retry-After honoured: the next matching request came ≥ 1 s after each 429 (both our client and kopf).
            seen = r["seen"]
            gaps = [b["t"] - a["t"] for a, b in zip(seen, seen[1:], strict=False) if a["outcome"] == "fault"]
            assert gaps and min(gaps) >= 0.95, (r["spec"], gaps)
    # The operator's own retries absorbed the faults: no handler failed (kopf would log "Handler … failed …").
    log = op.logs()[log_start:]
    assert " failed with an exception" not in log and " failed temporarily" not in log, log[-4000:]
    assert "retry 1/" in log or not any(r["spec"].startswith(("GET:experiments", "POST:", "PATCH:")) for r in rules)
    if kind.in_gap:  # the Job's change came with kopf's re-listing, and the operator acted on it
        assert "job changed while unwatched" in log, log[-4000:]


# ---------------------------------------------------------------------------------------------------------------
# 3. Two operator replicas


@pytest.mark.k8s
def test_two_operators_at_once_create_no_duplicates(emu: Emulator, tmp_path: Path, reliability: Record) -> None:
    """The unsupported case the chart prevents: two `kopf run` on the same namespace. Both act (each creates and
    writes status); deterministic names + 409-adopt leave exactly one of every child, and the status converges."""
    cluster = emu.cluster
    ns = new_namespace(cluster, "lh-two")
    emu.faults(rules=[], delays={"POST:jobs": 0.2, "POST:configmaps": 0.2}, drop_watches_s=0, reset_counts=True)
    ops = [H.Operator(cluster, ns, tmp_path / f"op{i}") for i in (1, 2)]
    exps = [Exp("two-a"), Exp("two-b"), Exp("two-c", (5, 6))]
    try:
        for op in ops:
            op.workdir.mkdir()
            op.start()
        apply(cluster, ns, exps)
        done, notes = _drive(emu, ns, exps)
        results = [done[e.name] for e in exps]
        answers = emu.state()["answers"]
    finally:
        for op in ops:
            op.stop()
        emu.faults(delays={})
    verdicts = emu.judge_all(ns, exps)
    duplicates = sum(v.extra for v in verdicts.values())
    reconciled = [op.logs().count('"message": "reconciled"') for op in ops]
    raced = answers.get("POST jobs 409", 0) + answers.get("POST configmaps 409", 0)
    reliability(
        AREA,
        "two operator replicas at once (unsupported; chart enforces 1)",
        injected=len(exps),
        survived=sum(1 for ok, v in zip(results, verdicts.values(), strict=True) if ok and not v.extra),
        lost=duplicates,
        lost_what="duplicate Jobs/ConfigMaps",
    )
    print(
        f"\ntwo operators: reconciles {reconciled}, creates that lost the race (409 → adopted) {raced}, "
        f"duplicates {duplicates}"
    )
    assert all(results) and duplicates == 0, (notes, {n: v.problems for n, v in verdicts.items()})
    assert all(n > 0 for n in reconciled), f"both operators act: {reconciled}"


@pytest.mark.k8s
def test_chart_runs_exactly_one_replica_and_recreates(tmp_path: Path) -> None:
    chart = ROOT / "charts/longhaul"
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp_path / "c"),
        "HELM_CONFIG_HOME": str(tmp_path / "g"),
        "HELM_DATA_HOME": str(tmp_path / "d"),
    }

    def helm(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [H._tool("helm"), "template", "lh", str(chart), *args], capture_output=True, text=True, env=env, timeout=120
        )

    out = helm()
    assert out.returncode == 0, out.stderr
    (dep,) = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "Deployment"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    assert "--standalone" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    for args in (
        ["--set", "replicaCount=2"],
        ["--skip-schema-validation", "--set", "replicaCount=2"],
        ["--skip-schema-validation", "--set", "replicaCount=0"],
    ):
        out = helm(*args)
        assert out.returncode != 0, args
        if "--skip-schema-validation" in args:  # the template's own refusal, with the reason
            assert "exactly one replica" in out.stderr, out.stderr
    out = helm("--skip-schema-validation", "--set", "replicaCount=1")
    assert out.returncode == 0, out.stderr
