"""``bench.sla``'s own parts: the arguments ``vllm bench serve`` gets, its saved result read, and
the table, with the SLA and the gateway's bounds applied (the run itself needs the vLLM
environment and minutes: ``make bench-sla``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.sla import (
    Measured,
    Shape,
    aiperf_args,
    bench_args,
    compared,
    guidellm_args,
    read_aiperf,
    read_guidellm,
    table,
    vllm_argv,
)


def result(ttft: tuple[float, float], tpot: tuple[float, float]) -> dict[str, Any]:
    """The fields of a ``vllm bench serve --save-result`` file that the bench reads."""
    return {"completed": 100, "failed": 0, "request_throughput": 15.9, "request_goodput": 15.1,
            "p50_ttft_ms": ttft[0], "p99_ttft_ms": ttft[1], "p50_tpot_ms": tpot[0],
            "p99_tpot_ms": tpot[1], "p50_itl_ms": 20.1, "p99_itl_ms": 21.5}  # fmt: skip


def test_the_sla_run_and_a_closed_loop_one_ask_what_the_issue_names() -> None:
    shape = Shape()
    sla = bench_args(shape, "http://gw", Path("/tok"), Path("/out/x.json"))
    assert sla[sla.index("--num-prompts") + 1] == "1000"
    assert sla[sla.index("--request-rate") + 1] == "16"
    assert sla[sla.index("--max-concurrency") + 1] == "64"
    assert sla[sla.index("--goodput") + 1 : sla.index("--goodput") + 3] == ["ttft:250", "tpot:40"]
    assert sla[sla.index("--result-dir") + 1] == "/out"
    assert sla[sla.index("--result-filename") + 1] == "x.json"
    loop = bench_args(shape, "http://gw", Path("/tok"), Path("/out/y.json"), concurrency=64)
    assert loop[loop.index("--request-rate") + 1] == "inf"
    assert loop[loop.index("--max-concurrency") + 1] == "64"
    assert loop[loop.index("--num-prompts") + 1] == "256"  # four requests per client
    one = bench_args(shape, "http://gw", Path("/tok"), Path("/out/z.json"), concurrency=1)
    assert one[one.index("--num-prompts") + 1] == "16"  # at least --sweep-prompts


def test_the_table_says_what_the_gateway_adds_against_its_bounds() -> None:
    direct = Measured.read("direct", None, result((60.5, 70.0), (20.2, 20.4)))
    within = Measured.read("thinkgate", None, result((62.0, 74.5), (20.3, 21.2)))
    over = Measured.read("thinkgate", None, result((62.0, 75.5), (20.3, 20.5)))
    assert direct.ttft == (60.5, 70.0) and direct.goodput == 15.1 and direct.passes
    shown = table(Shape(), [direct, within])
    assert "| TTFT | +4.50 | 5 | yes |" in shown
    assert "| TPOT | +0.80 | 1 | yes |" in shown
    assert "| TTFT | +5.50 | 5 | no |" in table(Shape(), [direct, over])
    slow = Measured.read("direct", None, result((200.0, 260.0), (20.0, 20.0)))
    assert not slow.passes  # TTFT p99 over 250 ms
    same = result((61.0, 66.0), (20.2, 20.3))
    swept = [Measured.read(target, 4, same) for target in ("direct", "thinkgate")]
    assert "| 4 | 15.10 | 15.10 | 66.0 | 66.0 | 20.30 | 20.30 |" in table(Shape(), swept)


def test_aiperfs_export_is_read_with_its_own_metric_names() -> None:
    def stats(p50: float, p99: float) -> dict[str, Any]:
        return {"unit": "ms", "avg": p50, "p50": p50, "p99": p99}

    export = {"time_to_first_token": stats(62.0, 70.0), "inter_token_latency": stats(20.1, 20.6),
              "request_count": {"unit": "requests", "avg": 1000.0},
              "request_throughput": {"unit": "requests/sec", "avg": 15.2},
              "goodput": {"unit": "requests/sec", "avg": 15.0}}  # fmt: skip
    got = read_aiperf("thinkgate", export)
    assert (got.target, got.completed, got.failed, got.request_rate, got.goodput) == (
        "thinkgate (AIPerf)", 1000, 0, 15.2, 15.0)  # fmt: skip
    assert got.ttft == (62.0, 70.0) and got.tpot == (20.1, 20.6) and got.passes
    args = aiperf_args(Shape(), "http://gw", Path("/tok"), Path("/out"), "sk-x")
    assert args[args.index("--request-rate") + 1] == "16"
    assert args[args.index("--concurrency") + 1] == "64"
    assert args[args.index("--goodput") + 1] == "time_to_first_token:250 inter_token_latency:40"
    assert "--use-server-token-count" in args and "--streaming" in args


def test_guidellms_report_is_read_with_its_itl_as_tpot_and_its_requests_counted() -> None:
    def stats(p50: float, p99: float) -> dict[str, Any]:
        return {"successful": {"median": p50, "percentiles": {"p50": p50, "p99": p99}}}

    def request(start: float, ttft: float, itl: float) -> dict[str, Any]:
        return {"request_start_time": start, "request_end_time": start + 1.0,
                "time_to_first_token_ms": ttft, "inter_token_latency_ms": itl}  # fmt: skip

    requests = [request(100.0, 62.0, 20.0), request(101.0, 300.0, 20.0),
                request(102.0, 63.0, 20.5), request(103.0, 64.0, 41.0)]  # fmt: skip
    report = {"benchmarks": [{"duration": 1.0, "requests": {"successful": requests}, "metrics": {
        "request_totals": {"successful": 4, "errored": 1, "incomplete": 0, "total": 5},
        "time_to_first_token_ms": stats(63.5, 300.0),
        "time_per_output_token_ms": stats(22.4, 25.0),  # counts the first token's wait: unused
        "inter_token_latency_ms": stats(20.2, 41.0)}}]}  # fmt: skip
    got = read_guidellm("direct", report)
    assert (got.target, got.completed, got.failed) == ("direct (guidellm)", 4, 1)
    assert got.ttft == (63.5, 300.0) and got.tpot == got.itl == (20.2, 41.0)
    assert got.request_rate == 1.0 and got.goodput == 0.5  # 4 and 2 in 4 s (100 to 104)
    assert not got.passes
    args = guidellm_args(Shape(), "http://gw", Path("/tok"), Path("/out/g.json"), "sk-x")
    assert args[args.index("--profile") + 1] == "kind=poisson,rate=16,max_concurrency=64"
    assert args[args.index("--constraint") + 1] == "kind=max_requests,count=1000"
    data = args[args.index("--data") + 1]
    assert "prompt_tokens=256,prompt_tokens_stdev=74,prompt_tokens_min=128" in data
    assert "output_tokens=128,output_tokens_stdev=37,output_tokens_min=64" in data
    assert args[args.index("--output") + 1] == "kind=json,path=/out/g.json"
    assert "api_key=sk-x" in args[args.index("--backend") + 1]


def test_thinkgate_benchs_added_latency_is_set_beside_vllm_bench_serves() -> None:
    def at(target: str, ttft99: float, itl99: float) -> Measured:
        return Measured(target, 16, 100, 0, 10.0, 0.0, (60.0, ttft99), (20.0, itl99),
                        (20.0, itl99))  # fmt: skip

    measured = [at("direct", 70.0, 21.0), at("thinkgate", 73.0, 21.5),
                at("direct (thinkgate bench)", 69.0, 21.2),
                at("thinkgate (thinkgate bench)", 71.5, 21.6),
                Measured("thinkgate", 64, 1, 0, 1.0, 0.0, (9.0, 99.0), (9.0, 99.0),
                         (9.0, 99.0))]  # fmt: skip
    lines = compared(Shape(), measured)
    assert "| TTFT | +3.00 | +2.50 | 1.20 |" in lines
    assert "| ITL | +0.50 | +0.40 | 1.25 |" in lines
    assert compared(Shape(), measured[:2]) == []  # thinkgate bench did not run


def test_a_real_engine_gets_room_for_the_longest_request_and_says_so() -> None:
    shape = Shape(engine="vllm", input_len=128, output_len=64, max_concurrency=16)
    argv = vllm_argv(Path("/models/tiny"), 8123, shape)
    assert argv[argv.index("--served-model-name") + 1] == "deepseek-r1"
    assert argv[argv.index("--reasoning-parser") + 1] == "deepseek_r1"
    assert "--enable-prefix-caching" in argv
    assert argv[argv.index("--max-num-seqs") + 1] == "16"
    # ±50 % of each length, and the chat template's tokens on top
    assert int(argv[argv.index("--max-model-len") + 1]) > (128 + 64) * 1.5
    direct = Measured.read("direct", None, result((60.5, 70.0), (20.2, 20.4)))
    assert "Engine: vLLM on the CPU" in table(shape, [direct])
    assert "Engine: `thinkgate sim`" in table(Shape(), [direct])
    with pytest.raises(ValueError, match="512 positions"):  # the issue's lengths do not fit
        vllm_argv(Path("/models/tiny"), 8123, Shape(engine="vllm"))
