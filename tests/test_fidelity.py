"""`python -m lab fidelity`: teacher-forced agreement with the float32 reference. The reference agrees with itself
exactly; a deliberately wrong engine (its logits' vocabulary rolled by one) agrees almost nowhere."""
import numpy as np
import pytest

import lab.bench.fidelity as fidelity
from lab.errors import LabError


@pytest.mark.slow
def test_the_reference_agrees_with_itself_and_a_broken_engine_does_not(monkeypatch):
    real = fidelity._lab_scorer

    def scorer(dtype):
        if dtype != "broken":
            return real(dtype)
        score, _ = real("float32")
        return (lambda ids: np.roll(score(ids), 1, axis=-1)), "float32, vocabulary rolled by one"
    monkeypatch.setattr(fidelity, "_lab_scorer", scorer)
    monkeypatch.setattr(fidelity, "ENGINES", fidelity.ENGINES + ("broken",))
    result = fidelity.fidelity(["float32", "broken"], prompts=2, new_tokens=12)
    rows = result["configs"]
    assert rows["float32"]["top1_agreement"] == 1.0 and rows["float32"]["mean_kl_nats"] == 0.0
    assert rows["float32"]["positions"] == rows["broken"]["positions"] > 0
    assert rows["broken"]["top1_agreement"] < 0.2 and rows["broken"]["mean_kl_nats"] > 1
    assert "| broken | float32, vocabulary rolled by one |" in fidelity.format_fidelity(result)


def test_an_unknown_configuration_is_one_line():
    with pytest.raises(LabError, match="unknown configuration q3"):
        fidelity.fidelity(["q3"])
