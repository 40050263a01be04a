"""NCCL's transport stated from NCCL itself (stackprobe.runtime.nccl_transport): the NCCL_DEBUG=INFO connection lines
parsed into P2P / SHM / NET per channel and pair, and the runtime tier capturing them from real rank processes.

The log text below is written from NVIDIA/nccl's own format strings (never copied from a log): the line prefix of
``src/debug.cc`` (``"%s:%d:%d "`` host, pid, tid, then ``"[%d] NCCL INFO %s\\n"``, master line 330/354), and the
connection lines of ``src/transport/p2p.cc`` (v2.27.7-1 lines 386/393/398/406), ``shm.cc`` (v2.27.7-1 line 128:
``via SHM/%s/%s``; master line 116: ``via SHM/direct``) and ``net.cc`` (v2.27.7-1 lines 218/222/264)."""
import pytest

from stackprobe.runtime import nccl_transport as nt


def _line(rank, text, host="gpu-host-1", pid=41230):
    return f"{host}:{pid + rank}:{pid + rank + 7} [{rank}] NCCL INFO {text}"


# two ranks on one PCIe host, P2P over cuMem with read (p2p.cc "via P2P/%s%s%s": CUMEM, "/read", "")
P2P_LOG = "\n".join([
    _line(0, "NCCL version 2.27.7+cuda12.9"),
    _line(0, "cudaDriverVersion 13000"),
    _line(0, "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"),
    _line(0, "Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read"),
    _line(1, "Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read"),
    _line(1, "Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM/read"),
    _line(0, "Connected all rings, use ring PXN 0 GDR 0"),
])
# NCCL_P2P_DISABLE=1: the same pairs over shared memory (shm.cc 2.27.7 "via SHM/%s/%s", then master's "via SHM/direct")
SHM_LOG = "\n".join([
    _line(0, "Channel 00 : 0[0] -> 1[1] via SHM/direct/direct"),
    _line(1, "Channel 00 : 1[1] -> 0[0] via SHM/direct/direct"),
    _line(0, "Channel 01 : 0[0] -> 1[1] via SHM/direct"),
])
# two hosts: NET over sockets (net.cc "[send] via NET/%s/%d%s%s%s" and "[receive] ..."), P2P/IPC inside a host
MIXED_LOG = "\n".join([
    _line(0, "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC"),
    _line(1, "Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0"),
    _line(2, "Channel 00/0 : 1[1] -> 2[0] [receive] via NET/Socket/0", host="gpu-host-2"),
    _line(3, "Channel 00/0 : 3[1] -> 0[0] [send] via NET/IB/0(2)/GDRDMA(PCI)/Shared", host="gpu-host-2"),
    _line(2, "Channel 01/0 : 2[0] -> 3[1] via P2P/indirect/1[1]/read", host="gpu-host-2"),
])


def test_p2p_lines_give_the_transport_per_channel_and_pair():
    recs = nt.parse(P2P_LOG)
    assert len(recs) == 4
    assert recs[0] == {"channel": 0, "conn": 0, "from_rank": 0, "from_dev": 0, "to_rank": 1, "to_dev": 1,
                       "side": None, "transport": "P2P", "mechanism": "CUMEM", "read": True, "via": "P2P/CUMEM/read"}
    s = nt.summarize([P2P_LOG])
    assert (s["summary"], s["assessed"]) == ("P2P", True)
    assert s["mechanisms"] == {"P2P/CUMEM": 4} and s["pairs"] == {"0->1": ["P2P/CUMEM/read"],
                                                                  "1->0": ["P2P/CUMEM/read"]}
    assert s["nccl_version"] == "2.27.7+cuda12.9"
    assert nt.label(s) == "over P2P (P2P/CUMEM 4 connections)"


def test_shm_lines_in_both_formats_say_shm_not_p2p():
    s = nt.summarize([SHM_LOG])
    assert s["summary"] == "SHM" and s["transports"] == {"SHM": 3}
    assert [r["conn"] for r in s["connections"]] == [None, None, None]
    assert s["pairs"]["0->1"] == ["SHM/direct/direct", "SHM/direct"]


def test_net_and_p2p_together_are_mixed_with_each_mechanism():
    s = nt.summarize([MIXED_LOG])
    assert s["summary"] == "mixed (NET, P2P)"
    assert s["mechanisms"] == {"P2P/IPC": 1, "NET/Socket": 2, "NET/IB": 1, "P2P/indirect": 1}
    assert [r["side"] for r in s["connections"] if r["transport"] == "NET"] == ["send", "receive", "send"]
    assert s["connections"][-1]["read"] is True


def test_the_same_line_from_two_captures_counts_once():
    assert len(nt.summarize([P2P_LOG, P2P_LOG])["connections"]) == 4


@pytest.mark.parametrize("text,env,why", [
    (_line(0, "NCCL version 2.27.7+cuda12.9") + "\n" + _line(0, "Connected all rings, use ring PXN 0 GDR 0"),
     {"NCCL_DEBUG": "INFO"}, "2 NCCL INFO lines but none for a connection"),
    ("rank 0 ready\n", {"NCCL_DEBUG": "INFO"}, "no NCCL INFO line at all"),
    ("rank 0 ready\n", {"NCCL_DEBUG": "WARN"}, "NCCL_DEBUG was 'WARN' in the ranks, not INFO"),
    ("rank 0 ready\n", {}, "NCCL_DEBUG was not set in the ranks"),
    # a line that only looks like one: no "NCCL INFO" prefix, so not NCCL's
    ("Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n", {"NCCL_DEBUG": "INFO"}, "no NCCL INFO line at all"),
])
def test_no_transport_lines_is_not_assessed_never_a_guess(text, env, why):
    s = nt.summarize([text], env)
    assert (s["summary"], s["assessed"]) == ("not assessed: NCCL printed no transport lines", False)
    assert why in s["why"] and s["transports"] == {}
    assert nt.label(s).startswith("transport not assessed: NCCL printed no transport lines (")


def test_the_runtime_tier_captures_the_ranks_nccl_lines_for_real():
    """Two real rank processes (gloo on CPU) that print NCCL's SHM connection lines when NCCL_DEBUG=INFO, run the
    way the suite runs its baseline group (probe_env = DEBUG_ENV); the twin prints nothing: not assessed."""
    pytest.importorskip("torch")
    from stackprobe.runtime.orchestrate import run_probe
    cfg = {"sizes": [4096], "dtype": "float32", "warmup": 1, "rounds": 2, "sweep_rounds": 1, "graph_calls": 4,
           "graph_replays": 1}
    run = run_probe("p2p_fixture_probes:NcclLogProbe", 2, cfg, device="cpu", timeout=180, probe_env=nt.DEBUG_ENV)
    assert run.status == "ok", run.tail
    t = run.nccl_transport
    assert (t["summary"], t["transports"]) == ("SHM", {"SHM": 4}), t
    assert set(t["pairs"]) == {"0->1", "1->0"} and t["nccl_version"] == "2.27.7+cuda12.9"
    assert run.env["NCCL_DEBUG"] == "INFO" and not any("NCCL INFO" in ln for ln in run.tail)
    silent = run_probe("p2p_fixture_probes:SilentProbe", 2, cfg, device="cpu", timeout=180, probe_env=nt.DEBUG_ENV)
    assert silent.nccl_transport["summary"] == nt.NOT_ASSESSED
    off = run_probe("p2p_fixture_probes:NcclLogProbe", 2, cfg, device="cpu", timeout=180, probe_env={})
    assert off.nccl_transport is None       # the suite did not ask for NCCL's log: nothing claimed
