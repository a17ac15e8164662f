"""Every file under data/ is in the inventory, found by its loader's own path function, and still
loaded by the users the inventory names (lab/inventory.py); every manifest says what makes it.
Each check loops over every file and names every offender in one message, so one run lists all
that is wrong; a planted bad file shows each check can fail."""
import json
from collections.abc import Callable
from pathlib import Path

from lab.artifacts import repo_path
from lab.experiments import experiment_of
from lab.inventory import ENTRIES, Entry, data_files, entry_of, source_text
from lab.paths import DATA_DIR

FILES = data_files()


def problems(files: list[Path], entries: tuple[Entry, ...]) -> list[str]:
    """What is wrong between the files under data/ and the entries: a file no entry holds, a file
    its loader does not find, a user that no longer names it, an entry that holds nothing."""
    found, held = [], set()
    for path in files:
        entry = next((e for e in entries if path.relative_to(DATA_DIR).match(e.pattern)), None)
        if entry is None:
            found.append(f"{path}: in no entry of lab/inventory.py (delete it, or register what loads it)")
            continue
        held.add(entry)
        if entry.locate(path) != path:
            found.append(f"{path}: its loader finds {entry.locate(path)} instead")
    for entry in entries:
        if entry not in held:
            found.append(f"{entry.pattern}: an entry that holds no file")
        for user, text in entry.users:
            if text not in source_text(user):
                found.append(f"{entry.pattern}: {user} no longer contains {text!r}")
    return found


def manifest_problems(files: list[Path], name: Callable[[Path], str] = repo_path) -> list[str]:
    """Every JSON file among `files` that records no command, or that an experiment makes (it or its
    weights) without saying which; `name` gives a file's path as the registry spells it (a planted
    file under tmp_path borrows a real file's name)."""
    found = []
    for path in (p for p in files if p.suffix == ".json"):
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            found.append(f"{path}: not JSON ({error})")
            continue
        made = experiment_of(name(path)) or experiment_of(name(path.with_suffix(".safetensors")))
        # regenerated sets are shared by several experiments' trainers; none of them owns the manifest
        if made is not None and path.parent.name != "regen" and record.get("experiment") != made[0]:
            found.append(f"{path}: made by experiment {made[0]}; the manifest says {record.get('experiment')!r}")
        if not record.get("command"):
            found.append(f"{path}: records no command")
    return found


def test_every_data_file_is_registered_located_and_loaded():
    assert FILES, "no files under data/"
    found = problems(FILES, ENTRIES)
    assert not found, "\n".join(found)


def test_every_file_has_an_entry_by_the_librarys_own_first_match():
    # entry_of is what the library uses; problems() above matches by its own loop, so both must agree
    missing = [str(p) for p in FILES if entry_of(p) is None]
    assert not missing, "no entry_of for:\n" + "\n".join(missing)


def test_an_unregistered_file_a_moved_loader_and_a_dead_user_fail(tmp_path):
    stray = DATA_DIR / "eagle" / "stray.bin"  # never written: matching works on names alone
    moved = Entry("eagle/eagle1.safetensors", "moved", lambda p: tmp_path / p.name, ())
    dead = Entry("eagle/eagle1.safetensors", "dead user", lambda p: p, (("README.md", "no such text anywhere"),))
    head = DATA_DIR / "eagle" / "eagle1.safetensors"
    assert any("in no entry" in p for p in problems([stray], ENTRIES))
    assert any("its loader finds" in p for p in problems([head], (moved,)))
    assert any("no longer contains" in p for p in problems([head], (dead,)))
    assert any("holds no file" in p for p in problems([], (dead,)))


def test_every_manifest_names_the_experiment_or_the_command_that_makes_it():
    manifests = [p for p in FILES if p.suffix == ".json"]
    assert manifests, "no manifests under data/"
    found = manifest_problems(manifests)
    assert not found, "\n".join(found)


def test_a_manifest_without_its_experiment_or_command_is_reported(tmp_path):
    # copies of a real manifest that an experiment makes, each with one defect, under the real name
    real = DATA_DIR / "eagle" / "ablation-token-plain.json"
    assert experiment_of(repo_path(real)) is not None, "the planted file must borrow a file an experiment makes"
    record = json.loads(real.read_text())
    bad = {"unstamped": {k: v for k, v in record.items() if k != "experiment"},
           "wrong": {**record, "experiment": "another-experiment"},
           "commandless": {k: v for k, v in record.items() if k != "command"}}
    for folder, content in bad.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / real.name).write_text(json.dumps(content))
    (tmp_path / "broken.json").write_text("{not json")
    files = sorted(tmp_path.rglob("*.json"))
    found = manifest_problems(files, name=lambda p: repo_path(real.with_suffix(p.suffix)))
    assert any("unstamped" in p and "the manifest says None" in p for p in found)
    assert any("wrong" in p and "the manifest says 'another-experiment'" in p for p in found)
    assert any("commandless" in p and "records no command" in p for p in found)
    assert any("broken.json" in p and "not JSON" in p for p in found)
    assert manifest_problems([real]) == []  # and the real one passes
