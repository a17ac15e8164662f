"""Command-line smoke tests on the tiny target, and one-line errors. Commands run in this process
(lab.cli.main, as `python -m lab` runs it, sys.argv included), so torch is imported once; the first
test also runs `python -m lab` as its own process, the way a user starts it."""
import contextlib
import io
import json
import subprocess
import sys
from types import SimpleNamespace

from lab.cli import main


def lab(*args: str) -> SimpleNamespace:
    """`python -m lab ARGS`, in this process: its exit code, standard output and standard error."""
    out, err, argv = io.StringIO(), io.StringIO(), sys.argv
    sys.argv = ["lab/__main__.py", *args]  # what command_line() records, as under `python -m lab`
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit_:  # argparse's errors and --help
                code = exit_.code
    finally:
        sys.argv = argv
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def lab_process(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab", *args], capture_output=True, text=True, timeout=600)


def test_bench_smoke_json_schema(tmp_path):
    out = tmp_path / "b.json"
    r = lab_process("bench", "--target", "tiny", "--methods", "ar,sd,sd-tree,hf,hf-assisted,hf-pld", "--limit", "2",
            "--max-new-tokens", "8", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "| ar |" in r.stdout
    res = json.loads(out.read_text())
    assert set(res["machine"]) >= {"cpu", "cores", "gpu", "torch", "transformers"}
    assert res["config"]["methods"]["hf-pld"]["prompt_lookup_num_tokens"] == 4
    assert res["config"]["engine"] == "transformers (float32)"
    for name, m in res["methods"].items():
        assert set(m) >= {"tokens_per_s", "tau", "speedup", "new_tokens", "target_forwards",
                          "acceptance_by_position", "identical_to_ar", "per_prompt"}
        assert m["identical_to_ar"] is True, name
        row = m["per_prompt"][0]
        assert set(row) >= {"id", "token_ids", "text", "tau", "seconds", "identical_to_ar"}
    assert res["methods"]["ar"]["tau"] == 1.0


def test_bench_breakdown_accounts_for_every_millisecond_of_a_cycle(tmp_path):
    out = tmp_path / "b.json"
    r = lab("bench", "--target", "tiny", "--methods", "ar,sd,sd-tree", "--limit", "2", "--max-new-tokens", "8",
            "--breakdown", "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    floor = res["config"]["bandwidth_floor"]
    assert floor["weight_bytes"] > 0 and floor["read_gb_s"] > 0 and "bandwidth floor" in r.stdout
    for name, m in res["methods"].items():
        c, cycles = m["cycle_ms"], m["target_forwards"] - 2  # one prefill per prompt
        assert set(c) == {"propose", "forward", "verify", "commit", "loop", "prefill_per_prompt"}
        assert c["forward"] > 0 and c["verify"] > 0 and c["loop"] > 0, name
        # the phases and the prefills add up to the run's seconds (to the rounding of 3 decimals in ms)
        total = cycles * sum(v for k, v in c.items() if k != "prefill_per_prompt") + 2 * c["prefill_per_prompt"]
        assert abs(total / 1e3 - m["seconds"]) < 1e-5 * cycles + 1e-5, name
        assert f"| {name} |" in r.stdout.split("bandwidth floor")[1]
    assert res["methods"]["sd"]["cycle_ms"]["propose"] > res["methods"]["ar"]["cycle_ms"]["propose"]


def test_bench_sampling_rows_are_not_compared(tmp_path):
    out = tmp_path / "b.json"
    r = lab("bench", "--target", "tiny", "--methods", "ar,sd", "--limit", "1", "--max-new-tokens", "6",
            "--temperature", "0.8", "--top-p", "0.9", "--dtype", "bfloat16", "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["methods"]["sd"]["identical_to_ar"] is None and res["config"]["dtype"] == "bfloat16"
    assert res["config"]["engine"] == "lab.exact (bfloat16, batch-invariant)"


def test_an_unknown_dtype_or_command_is_one_line_with_the_choices():
    r = lab("bench", "--target", "tiny", "--methods", "ar", "--dtype", "float16")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "invalid choice: 'float16'" in r.stderr and "bfloat16" in r.stderr and "--help" in r.stderr
    r = lab("benchmark")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "choose from 'bench'" in r.stderr


def test_generate_streams_plain_text():
    r = lab("generate", "Hello", "--target", "tiny", "--method", "sd", "--max-new-tokens", "6", "--no-color")
    assert r.returncode == 0, r.stderr
    assert "\033[" not in r.stdout and "tok/s" in r.stderr


def test_bad_input_gives_one_line_errors(tmp_path):
    r = lab("bench", "--target", "tiny", "--dataset", "nope")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "choose one of" in r.stderr
    r = lab("bench", "--target", "tiny", "--methods", "ar,foo")
    assert r.returncode == 2 and "unknown method" in r.stderr
    r = lab("bench", "--target", "tiny", "--prompts", str(tmp_path / "none.jsonl"))
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_counts_head_names_and_stray_flags_are_one_line_errors():
    for flag, value in (("--limit", "0"), ("--max-new-tokens", "-3")):
        r = lab("bench", "--target", "tiny", "--methods", "ar", flag, value)
        assert (r.returncode == 2 and r.stderr.count("\n") == 1
                and f"{flag}: must be a whole number of at least 1" in r.stderr)
    r = lab("bench", "--target", "tiny", "--methods", "ar,eagle2", "--eagle-head", "nosuch")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "no data/eagle/nosuch.safetensors" in r.stderr and "eagle1-gpu" in r.stderr  # names the heads there are
    r = lab("bench", "--target", "tiny", "--methods", "eagle3", "--eagle3-head", "eagle1")
    assert r.returncode == 2 and "a head of kind eagle1, not eagle3" in r.stderr and "eagle3-full" in r.stderr
    r = lab("tune", "tree", "--head", "eagle1", "--name", "eagle3-full")
    assert r.returncode == 2 and "a head of kind eagle3, not eagle1" in r.stderr
    r = lab("generate", "Hi", "--target", "tiny", "--method", "ar", "--judge-threshold", "0.5")
    assert r.returncode == 2 and "add judge to the methods" in r.stderr


def test_eagle_head_of_another_target_is_a_one_line_error():
    r = lab("bench", "--target", "tiny", "--methods", "ar,eagle2", "--limit", "1", "--max-new-tokens", "4",
            "--eagle-tree", "2,2,4")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "another target or head shape" in r.stderr and "retrain" in r.stderr


def test_bad_eagle_tree_flag_is_a_one_line_error():
    r = lab("generate", "Hi", "--target", "tiny", "--method", "eagle2", "--eagle-tree", "4,4")
    assert r.returncode == 2 and "--eagle-tree must be three positive integers" in r.stderr


def test_lossy_methods_report_quality_and_are_not_lossless(tmp_path):
    out = tmp_path / "b.json"
    r = lab("bench", "--target", "tiny", "--methods", "ar,topk", "--verify-top-k", "3", "--dataset", "humaneval",
            "--limit", "1", "--max-new-tokens", "8", "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["methods"]["topk"]["lossless"] is False and res["methods"]["ar"]["lossless"] is True
    assert res["config"]["methods"]["topk"]["acceptance"].endswith("top 3")
    assert 0.0 <= res["methods"]["topk"]["humaneval_pass_at_1"] <= 1.0


def test_a_judge_head_of_another_target_is_a_one_line_error():
    r = lab("bench", "--target", "tiny", "--methods", "ar,judge", "--limit", "1", "--max-new-tokens", "4")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "another target" in r.stderr  # the shipped head is the real target's


def test_every_recorded_command_still_parses():
    """Options written once must keep every flag name: each `python -m lab ...` command recorded
    under data/ or listed by an experiment parses with today's command line."""
    import json
    import shlex

    from lab.cli import build_parser
    from lab.experiments import EXPERIMENTS
    from lab.paths import DATA_DIR

    def recorded(obj):
        if isinstance(obj, dict):
            for key, value in obj.items():
                if key in ("command", "run_by") and isinstance(value, str) and value.startswith("python -m lab "):
                    yield value
                else:
                    yield from recorded(value)
        elif isinstance(obj, list):
            for value in obj:
                yield from recorded(value)

    commands = {c for path in DATA_DIR.rglob("*.json") for c in recorded(json.loads(path.read_text()))}
    commands |= {f"python -m lab {c}" for e in EXPERIMENTS.values() for step in e.steps for c in step.commands}
    assert len(commands) > 50
    parser = build_parser()
    for command in sorted(commands):
        try:
            parser.parse_args(shlex.split(command)[3:])
        except SystemExit:
            raise AssertionError(f"no longer parses: {command}") from None
