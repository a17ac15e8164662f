"""Running untrusted generated code, never in the caller's process: a separate `python -I` process
with an empty environment, in an empty temporary folder, under wall-clock, CPU, memory and file-size
limits, with imports that reach outside the process refused. Any misbehaviour, a hang included,
becomes a failed `Outcome` with its reason."""
from __future__ import annotations

import ast
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# modules an answer to a HumanEval problem never needs, and that reach outside the process
FORBIDDEN = frozenset({"os", "sys", "subprocess", "shutil", "socket", "pathlib", "multiprocessing", "threading",
                       "ctypes", "signal", "importlib", "builtins", "io", "pickle", "tempfile", "glob", "urllib",
                       "http", "requests", "asyncio", "resource", "gc", "inspect"})


@dataclass
class Outcome:
    passed: bool
    reason: str  # "passed", "failed: <last line of the error>", "timeout", "forbidden import: <name>", "syntax error"


def forbidden_import(code: str) -> str | None:
    """A forbidden module imported, or a call of __import__, open, exec, compile, breakpoint or input;
    else None. SyntaxError if unparsable. `eval` is allowed: HumanEval/160's reference uses it."""
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "__import__", "open", "exec", "compile", "breakpoint", "input"):
            return node.func.id
        else:
            continue
        for name in names:
            if name.split(".")[0] in FORBIDDEN:
                return name
    return None


def _limits(memory_mb: int, cpu_seconds: int):
    def apply() -> None:  # runs in the child before Python starts
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    return apply


def run_python(code: str, timeout: float = 5.0, memory_mb: int = 512) -> Outcome:
    """Run `code` in a sandboxed child process; passed iff it exits with status 0 within `timeout` s."""
    try:
        name = forbidden_import(code)
    except SyntaxError:
        return Outcome(False, "syntax error")
    if name:
        return Outcome(False, f"forbidden import: {name}")
    with tempfile.TemporaryDirectory() as folder:
        try:
            done = subprocess.run([sys.executable, "-I", "-c", code], cwd=folder, capture_output=True, text=True,
                                  timeout=timeout, preexec_fn=_limits(memory_mb, int(timeout) + 1), env={})
        except subprocess.TimeoutExpired:
            return Outcome(False, "timeout")
    if done.returncode == 0:
        return Outcome(True, "passed")
    lines = done.stderr.strip().splitlines()
    return Outcome(False, "failed: " + (lines[-1][:200] if lines else f"exit status {done.returncode}"))


def check_humaneval(problem: dict, completion: str, timeout: float = 5.0) -> Outcome:
    """HumanEval's own check: the prompt, the completion (the body), the tests, `check(entry_point)`."""
    program = f"{problem['prompt']}{completion}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"
    return run_python(program, timeout)
