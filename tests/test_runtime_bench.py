"""The harness's correctness checks and floor, for real on CPU in this process (world size 1, no peers needed):
ops that cheat in different ways are caught, an op that does nothing sits on the floor (C22), an honest op
passes."""
import pytest

from stackprobe.runtime.bench import FLOOR, BenchConfig, Harness, Op, check_exact_range
from stackprobe.runtime.suite import size_record
from stackprobe.runtime.verdicts import decide

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def one_thread():
    """Timings in this process are compared with each other: keep torch on one core while they run."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Ctx:
    rank, world_size, device = 0, 1, "cpu"

    def barrier(self):
        pass

    def log(self, msg):
        pass


CFG = BenchConfig(sizes=[4096], dtype="float32", warmup=1, rounds=15, graph_calls=30, graph_replays=2)


def measure(make, nbytes=4096):
    h = Harness(Ctx(), CFG)
    return h.measure_size({"op": make}, nbytes, CFG.rounds)["units"]


def test_an_honest_out_of_place_op_passes_every_check():
    def make(nbytes):
        inp = torch.empty(nbytes // 4)
        out = torch.empty_like(inp)
        return Op(inp, out, lambda: torch.mul(inp, 1.0, out=out))   # the sum over one rank is the input
    u = measure(make)["op"]
    assert u["eager_correct"] and u["sequence_correct"] and u["timed_correct"], u
    assert len(u["samples_us"]) == CFG.rounds


@pytest.mark.parametrize("kind", ["stale", "snapshot", "never"])
def test_cheating_ops_are_caught(kind):
    """stale: writes the output on its first call only; snapshot: keeps reducing the input it saw first (like
    a graph that captured a copy); never: writes nothing at all (the poison stays)."""
    state = {}

    def make(nbytes):
        inp = torch.empty(nbytes // 4)
        out = torch.empty_like(inp)

        def run():
            state["n"] = state.get("n", 0) + 1
            if kind == "never" or (kind == "stale" and state["n"] > 1):
                return
            if kind == "snapshot":
                state.setdefault("first", inp.clone())
                out.copy_(state["first"])
                return
            out.copy_(inp)
        return Op(inp, out, run)
    u = measure(make)["op"]
    assert not (u.get("sequence_correct") and u.get("timed_correct")), u
    assert "samples_us" not in u            # wrong results are not timed
    if kind == "never":
        assert u["eager_correct"] is False  # the poisoned output was left as it was


def test_an_op_that_does_nothing_sits_on_the_floor_and_is_an_error():
    def make(nbytes):
        buf = torch.empty(nbytes // 4)
        return Op(buf, buf, lambda: None, in_place=True)   # in place at world size 1: "correct", and no work
    # 1 MB: the floor (one add over 256K floats per call) dwarfs Python's call overhead. The rule's margin is 5 % of
    # the floor, which a CPU host's timing noise can pass now and then (seen once in a clean-clone CI run): the
    # no-op must read "no work" in one of three measurements; the real-work twin below must never read so.
    for _ in range(3):
        units = measure(make, 1 << 20)
        rec = size_record(1 << 20, units["op"], units[FLOOR], units["op"], 1, False)
        if rec["no_gpu_work"]:
            break
    assert rec["no_gpu_work"] is True
    row = {"backend": "noop", "world_size": 1, "kind": "backend", "outcome": "ok", "sweep": [rec],
           "pairing": "in-process"}
    v = decide(row)
    assert v.status == "error" and "no GPU work captured" in v.cause

    def make_real(nbytes):
        buf = torch.empty(nbytes // 4)
        scratch = torch.empty(nbytes // 4 * 16)          # 16x the floor's memory traffic
        return Op(buf, buf, lambda: (scratch.mul_(1.0), None)[1], in_place=True)
    for _ in range(3):
        units = measure(make_real, 1 << 20)
        assert size_record(1 << 20, units["op"], units[FLOOR], units["op"], 1, False)["no_gpu_work"] is False


def test_checked_values_must_stay_exact_in_the_dtype():
    check_exact_range("bfloat16", 8, 122)                   # 8*6 + 28 + 122 = 198 <= 256
    with pytest.raises(ValueError, match="lower --graph-calls or use --dtype float32"):
        check_exact_range("bfloat16", 8, 200)
    check_exact_range("float32", 8, 100000)
