"""Every file under data/ is in the inventory, found by its loader's own path function, and still
loaded by the users the inventory names (lab/inventory.py)."""
import json
from pathlib import Path

import pytest

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


def test_every_data_file_is_registered_located_and_loaded():
    assert FILES, "no files under data/"
    assert problems(FILES, ENTRIES) == []


def test_every_file_has_exactly_the_entry_the_first_match_gives():
    assert all(entry_of(p) is not None for p in FILES)


def test_an_unregistered_file_a_moved_loader_and_a_dead_user_fail(tmp_path):
    stray = DATA_DIR / "eagle" / "stray.bin"  # never written: matching works on names alone
    moved = Entry("eagle/eagle1.safetensors", "moved", lambda p: tmp_path / p.name, ())
    dead = Entry("eagle/eagle1.safetensors", "dead user", lambda p: p, (("README.md", "no such text anywhere"),))
    head = DATA_DIR / "eagle" / "eagle1.safetensors"
    assert any("in no entry" in p for p in problems([stray], ENTRIES))
    assert any("its loader finds" in p for p in problems([head], (moved,)))
    assert any("no longer contains" in p for p in problems([head], (dead,)))
    assert any("holds no file" in p for p in problems([], (dead,)))


@pytest.mark.parametrize("path", [p for p in FILES if p.suffix == ".json"], ids=lambda p: p.name)
def test_every_manifest_names_the_experiment_or_the_command_that_makes_it(path):
    record = json.loads(path.read_text())
    made = experiment_of(repo_path(path)) or experiment_of(repo_path(path.with_suffix(".safetensors")))
    if made is not None and path.parent.name != "regen":
        assert record.get("experiment") == made[0], f"{path}: made by experiment {made[0]}; the manifest does not say"
    assert record.get("command"), f"{path}: records no command"
