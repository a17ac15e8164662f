"""The exercises of chapters 01, 02 and 03: each check passes the chapter's own solution and a correct
function written differently, and fails the classic wrong answer with a message that names it."""
import nbformat
import pytest

from lab.check import ExerciseError
from lab.check.cost import (check_cost_ratio, check_flat_until, check_kv_bytes, check_priced_speedup,
                            check_speculation_pays, check_verify_bound)
from lab.check.sampling import check_best_gamma, check_tokens_per_cycle
from lab.exercises import solution_cells
from lab.paths import INSTRUCTOR_DIR

CHAPTERS = ("01_autoregressive_cost", "02_rejection_sampling", "03_vanilla_speculative_decoding")


def chapter_solutions() -> dict:
    """The functions the three chapters' solution cells define, by name."""
    namespace = {}
    for name in CHAPTERS:
        for cell in solution_cells(nbformat.read(INSTRUCTOR_DIR / f"{name}.ipynb", as_version=4)):
            exec(cell.source, namespace)
    return namespace


SOLUTION = chapter_solutions()


def test_every_chapter_has_at_least_two_exercises():
    for name in CHAPTERS:
        notebook = nbformat.read(INSTRUCTOR_DIR / f"{name}.ipynb", as_version=4)
        assert len(solution_cells(notebook)) >= 2, name


# ---- 01 (a): KV-cache bytes per token --------------------------------------------------------

def _head_dim(config):
    return config["head_dim"] if config.get("head_dim") else config["hidden_size"] // config["num_attention_heads"]


def test_kv_bytes_check_passes_correct_answers():
    def by_parts(config, element):
        per_layer = config["num_key_value_heads"] * _head_dim(config) * element  # one key or one value
        return sum(2 * per_layer for _ in range(config["num_hidden_layers"]))
    check_kv_bytes(by_parts)
    check_kv_bytes(SOLUTION["kv_bytes_per_token"])


def test_kv_bytes_without_the_factor_two_fails():
    with pytest.raises(ExerciseError, match="factor 2 is missing"):
        check_kv_bytes(lambda c, e: c["num_hidden_layers"] * c["num_key_value_heads"] * _head_dim(c) * e)


def test_kv_bytes_with_attention_heads_fails():
    with pytest.raises(ExerciseError, match="you used num_attention_heads"):
        check_kv_bytes(lambda c, e: 2 * c["num_hidden_layers"] * c["num_attention_heads"] * _head_dim(c) * e)


def test_kv_bytes_ignoring_a_given_head_dim_fails():
    with pytest.raises(ExerciseError, match="use it"):
        check_kv_bytes(lambda c, e: 2 * c["num_hidden_layers"] * c["num_key_value_heads"]
                       * (c["hidden_size"] // c["num_attention_heads"]) * e)


# ---- 01 (b): how far T(k) stays flat ----------------------------------------------------------

def test_flat_until_check_passes_correct_answers():
    def scan(times, tolerance):
        best = 1
        for k in sorted(times):
            if times[k] / times[1] <= 1 + tolerance:
                best = k
        return best
    check_flat_until(scan)
    check_flat_until(SOLUTION["flat_until"])


def test_flat_until_stopping_at_the_first_bump_fails():
    def first_bump(times, tolerance):
        best = 1
        for k in sorted(times):
            if times[k] > (1 + tolerance) * times[1]:
                break
            best = k
        return best
    with pytest.raises(ExerciseError, match="need not be monotone"):
        check_flat_until(first_bump)


def test_flat_until_with_a_strict_comparison_fails():
    with pytest.raises(ExerciseError, match="'at most' includes equality"):
        check_flat_until(lambda times, tol: max(k for k, t in times.items() if k == 1 or t < (1 + tol) * times[1]))


def test_flat_until_with_an_absolute_tolerance_fails():
    with pytest.raises(ExerciseError, match="relative"):
        check_flat_until(lambda times, tol: max(k for k, t in times.items() if t <= times[1] + tol))


def test_flat_until_against_the_smallest_time_fails():
    with pytest.raises(ExerciseError, match="not the smallest time"):
        check_flat_until(lambda times, tol: max(k for k, t in times.items() if t <= (1 + tol) * min(times.values())))


# ---- 01 (c): (γ+1)·T(1)/T(γ+1) ----------------------------------------------------------------

def test_verify_bound_check_passes_correct_answers():
    check_verify_bound(lambda times, gamma: times[1] / times[gamma + 1] * (gamma + 1))
    check_verify_bound(SOLUTION["verify_bound"])


def test_verify_bound_off_by_one_fails():
    with pytest.raises(ExerciseError, match="scores 4 positions"):
        check_verify_bound(lambda times, gamma: gamma * times[1] / times[gamma])


def test_verify_bound_inverted_fails():
    with pytest.raises(ExerciseError, match="inverted"):
        check_verify_bound(lambda times, gamma: times[gamma + 1] / ((gamma + 1) * times[1]))


# ---- 03 (a): c from parameter counts ----------------------------------------------------------

def _weights(config, layers, head_copies=1, kv_key="num_key_value_heads"):
    hidden, dim = config["hidden_size"], _head_dim(config)
    q_o = 2 * hidden * config["num_attention_heads"] * dim
    k_v = 2 * hidden * config[kv_key] * dim
    mlp = 3 * hidden * config["intermediate_size"]
    return layers * (q_o + k_v + mlp) + head_copies * config["vocab_size"] * hidden


def test_cost_ratio_check_passes_correct_answers():
    check_cost_ratio(lambda config, n: _weights(config, n) / _weights(config, config["num_hidden_layers"]))
    check_cost_ratio(SOLUTION["predicted_cost_ratio"])


def test_cost_ratio_without_the_lm_head_fails():
    with pytest.raises(ExerciseError, match="left out the LM head"):
        check_cost_ratio(lambda config, n: n / config["num_hidden_layers"])


def test_cost_ratio_counting_the_embedding_fails():
    with pytest.raises(ExerciseError, match="gather"):
        check_cost_ratio(lambda config, n: _weights(config, n, 2) / _weights(config, config["num_hidden_layers"], 2))


def test_cost_ratio_with_attention_heads_for_keys_and_values_fails():
    def wrong(config, n):
        return (_weights(config, n, kv_key="num_attention_heads")
                / _weights(config, config["num_hidden_layers"], kv_key="num_attention_heads"))
    with pytest.raises(ExerciseError, match="num_key_value_heads x head_dim"):
        check_cost_ratio(wrong)


# ---- 03 (b): can speculation pay? -------------------------------------------------------------

def test_speculation_pays_check_passes_correct_answers():
    def search(pairs):
        def pays(alpha, c):
            return any(sum(alpha ** i for i in range(g + 1)) / (g * c + 1) > 1 for g in range(1, 64))
        return [pays(alpha, c) for alpha, c in pairs]
    check_speculation_pays(search)
    check_speculation_pays(SOLUTION["speculation_can_pay"])


def test_speculation_pays_at_alpha_equal_c_fails():
    with pytest.raises(ExerciseError, match="alpha = c"):
        check_speculation_pays(lambda pairs: [alpha >= c for alpha, c in pairs])


def test_speculation_pays_swapped_fails():
    with pytest.raises(ExerciseError, match="pays for any alpha > 0"):
        check_speculation_pays(lambda pairs: [c > alpha for alpha, c in pairs])


# ---- 03 (c): the priced prediction at γ = 1 ----------------------------------------------------

def test_priced_speedup_check_passes_correct_answers():
    check_priced_speedup(lambda alpha, c, verify: (1 - alpha ** 2) / (1 - alpha) / (c + verify) if alpha < 1
                         else 2 / (c + verify))
    check_priced_speedup(SOLUTION["priced_speedup_gamma1"])


def test_priced_speedup_unpriced_fails():
    with pytest.raises(ExerciseError, match="as one target step"):
        check_priced_speedup(lambda alpha, c, verify: (1 + alpha) / (1 + c))


def test_priced_speedup_with_an_extra_step_fails():
    with pytest.raises(ExerciseError, match="no further 1"):
        check_priced_speedup(lambda alpha, c, verify: (1 + alpha) / (1 + c + verify))


# ---- 02: expected tokens per cycle and the best γ ---------------------------------------------

def test_tokens_per_cycle_check_passes_correct_answers():
    check_tokens_per_cycle(lambda alpha, gamma: sum(alpha ** i for i in range(gamma + 1)))
    check_tokens_per_cycle(SOLUTION["tokens_per_cycle"])


def test_tokens_per_cycle_without_the_bonus_token_fails():
    with pytest.raises(ExerciseError, match="one token short"):
        check_tokens_per_cycle(lambda alpha, gamma: sum(alpha ** i for i in range(gamma)))


def test_tokens_per_cycle_closed_form_at_alpha_one_fails():
    with pytest.raises(ExerciseError, match="return the limit gamma \\+ 1"):
        check_tokens_per_cycle(lambda alpha, gamma: (1 - alpha ** (gamma + 1)) / (1 - alpha))


def test_tokens_per_cycle_linear_in_gamma_fails():
    with pytest.raises(ExerciseError, match="alpha\\^i, not alpha"):
        check_tokens_per_cycle(lambda alpha, gamma: 1 + gamma * alpha)


def _speedup(alpha, gamma, c):
    return sum(alpha ** i for i in range(gamma + 1)) / (gamma * c + 1)


def test_best_gamma_check_passes_correct_answers():
    def scan(alpha, c, max_gamma):
        best = 0
        for gamma in range(1, max_gamma + 1):
            if _speedup(alpha, gamma, c) > _speedup(alpha, best, c):
                best = gamma
        return best
    check_best_gamma(scan)
    check_best_gamma(SOLUTION["best_gamma"])


def test_best_gamma_searching_from_one_fails():
    with pytest.raises(ExerciseError, match="so gamma = 0"):
        check_best_gamma(lambda alpha, c, m: max(range(1, m + 1), key=lambda g: _speedup(alpha, g, c)))


def test_best_gamma_keeping_the_last_of_a_tie_fails():
    def last_maximum(alpha, c, max_gamma):
        return max(reversed(range(max_gamma + 1)), key=lambda g: _speedup(alpha, g, c))
    with pytest.raises(ExerciseError, match="tie goes to the smallest"):
        check_best_gamma(last_maximum)
