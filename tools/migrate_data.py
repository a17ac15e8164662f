"""One-off: bring every JSON file under data/ to the current format, so the readers need no
branches for older files. Run once (python tools/migrate_data.py); it is idempotent.

* every file an experiment of lab/experiments.py makes names that experiment (`experiment`);
* the kernel benchmark records the command `make gpu-check` ran;
* head manifests (and the manifests nested in them) call the sequences per optimiser step
  `batch_sequences` in every trainer (the EAGLE-3 trainer wrote `global_batch_sequences`);
* bench results record `dtype`, `engine` and the heads their EAGLE methods used, as today's
  bench does, and a bfloat16 run of transformers' forward gets the flag (`--engine transformers`)
  that makes its recorded command run that forward again.
"""
import json
import re
import shlex
from pathlib import Path

from lab.artifacts import repo_path, write_json
from lab.experiments import experiment_of
from lab.paths import DATA_DIR, EAGLE3_SHIPPED


def flag(command: str, name: str, default: str) -> str:
    words = shlex.split(command)
    return words[words.index(name) + 1] if name in words else default


def bench_config(config: dict, command: str) -> str:
    config.setdefault("dtype", flag(command, "--dtype", "float32"))
    config.setdefault("engine", f"transformers ({config['dtype']})")
    if config["dtype"] == "bfloat16" and config["engine"].startswith("transformers") and "--engine" not in command:
        command = command.replace(" --json", " --engine transformers --json", 1)
    kinds = {s.get("head") for s in config.get("methods", {}).values()}
    if "eagle1" in kinds:
        config.setdefault("eagle_head", flag(command, "--eagle-head", "eagle1"))
    if "eagle3" in kinds:
        config.setdefault("eagle3_head", flag(command, "--eagle3-head", EAGLE3_SHIPPED))
    return command


def optimiser(manifest: dict) -> None:
    while manifest:
        opt = manifest.get("optimiser", {})
        if "global_batch_sequences" in opt:
            manifest["optimiser"] = {("batch_sequences" if k == "global_batch_sequences" else k): v
                                     for k, v in opt.items()}
        manifest = (manifest.get("init") or {}).get("manifest")


def with_experiment(record: dict, name: str) -> dict:
    out = {}
    for k, v in record.items():
        if k != "experiment":
            out[k] = v
        if k == "command":
            out["experiment"] = name
    if "experiment" not in out:
        out = {"experiment": name, **out}
    return out


def migrate(path: Path) -> None:
    record = json.loads(path.read_text())
    before = json.dumps(record)
    if path.parent.name == "kernel_bench":
        record.setdefault("command", "python -m lab.kernels.bench --out data/kernel_bench")
    if path.parent.name == "eagle":
        optimiser(record)
    if path.parent.name == "results":
        if "config" in record:
            record["command"] = bench_config(record["config"], record["command"])
        for setting in record.get("settings", {}).values():
            setting["command"] = bench_config(setting["config"], setting["command"])
    made = experiment_of(repo_path(path)) or experiment_of(repo_path(path.with_suffix(".safetensors")))
    if made is None and path.parent.name == "regen":
        made = experiment_of(repo_path(path.with_name(re.sub(r"manifest", "sharegpt_smollm2", path.stem) + ".npz")))
    if made is not None:
        record = with_experiment(record, made[0])
    if json.dumps(record) != before:
        write_json(path, record)
        print("migrated", repo_path(path))


if __name__ == "__main__":
    for path in sorted(DATA_DIR.rglob("*.json")):
        migrate(path)
