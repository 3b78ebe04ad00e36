"""The portable-softmax command as a user runs it: the demo checks itself; files in, files out; every
mistake is one line on stderr with exit status 2, never a traceback or a numpy warning."""

from __future__ import annotations

import doctest
import io
import os
import subprocess
import sys

import checks
import ml_dtypes
import numpy as np
import pytest
from checks import assert_matches

import portable_softmax
from portable_softmax import _probe, _tolerance, cli, reference
from portable_softmax.cli import main


def run_cli(*argv: str, stdin: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """The command in a fresh interpreter, as from a shell."""
    return subprocess.run([sys.executable, "-m", "portable_softmax.cli", *argv], input=stdin, capture_output=True,
                          timeout=300, env={**os.environ, **(env or {})})


def one_error_line(stderr: str) -> str:
    """The single line an error prints (no traceback, progress bar or table before it)."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("portable-softmax: error: "), stderr
    return lines[0]


# ------------------------------------------------------------------------------------------------ demo


def test_demo_checks_against_the_reference_after_saying_what_ran(capsys):
    assert main(["run"]) == 0
    err = capsys.readouterr().err
    header = err.index("softmax on ")
    check = err.index("check against the float64 reference")
    assert header < check
    assert "demo input 4096x1000 float32" in err[header:check]
    assert "within atol 1e-06, rtol 1e-05" in err
    for step in ("runtime init", "compute", "total"):
        assert step in err
    # the demo input is made, not read: its generation is no step of the timing
    assert "read" not in err[check:]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_16_bit_demo_is_checked_with_the_suites_ulp_bound(capsys, dtype, log):
    assert main(["run", "--dtype", dtype, *(["--log"] if log else [])]) == 0
    err = capsys.readouterr().err
    assert f"within {_tolerance.ULP_BOUND} ulp of {dtype} + atol 1e-06" in err


def test_the_demo_and_the_suite_share_one_tolerance():
    assert (checks.ATOL, checks.RTOL, checks.ULP_BOUND) == (_tolerance.ATOL, _tolerance.RTOL, _tolerance.ULP_BOUND)
    x = np.random.default_rng(1).standard_normal((64, 50)).astype(np.float16) * 4
    y = reference.softmax(x).astype(np.float16)
    at = np.unravel_index(np.argmax(y), y.shape)  # a large value, where an ulp dwarfs atol
    y[at] = np.nextafter(np.nextafter(y[at], np.float16(0)), np.float16(0))  # 2 ulp down
    assert np.array_equal(checks.mismatches(y, x), _tolerance.outside(y, reference.softmax(x)))
    assert _tolerance.outside(y, reference.softmax(x)).sum() == 1


@pytest.mark.parametrize("dtype, describe", [("float32", "atol 1e-06, rtol 1e-05"),
                                             ("float16", "1 ulp of float16 + atol 1e-06")])
def test_demo_outside_the_tolerance_exits_1(capsys, monkeypatch, dtype, describe):
    def one_value_off(x, axis=-1):
        """The exact result, but its largest value 2 ulp low (float16) or 10 rtol low (float32)."""
        y = reference.softmax(x, axis).astype(x.dtype)
        at = np.unravel_index(np.argmax(y), y.shape)
        if dtype == "float16":
            y[at] = np.nextafter(np.nextafter(y[at], y.dtype.type(0)), y.dtype.type(0))
        else:
            y[at] *= 1 - 10 * _tolerance.RTOL
        return y

    monkeypatch.setattr(cli, "softmax", one_value_off)
    monkeypatch.setenv(_probe.ENV_VAR, "cpu")  # numpy arrays reach the stand-in on every machine
    assert main(["run", "--dtype", dtype]) == 1
    assert f"1 of 4096000 values OUTSIDE {describe}" in capsys.readouterr().err


# --------------------------------------------------------------------------------------- files in, out


def test_text_in_text_out(tmp_path, rng):
    x = rng.standard_normal((5, 7))
    src = tmp_path / "in.txt"
    np.savetxt(src, x, fmt="%.17g")
    out = tmp_path / "out.txt"
    assert main(["run", str(src), "-o", str(out), "--axis", "0"]) == 0
    y = np.loadtxt(out)
    assert y.dtype == np.float64 and y.shape == (5, 7)
    assert_matches(y, x, axis=0)


def test_npy_in_npy_out_log(tmp_path, rng):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    np.save(tmp_path / "in.npy", x)
    assert main(["run", str(tmp_path / "in.npy"), "-o", str(tmp_path / "out.npy"), "--log", "--axis", "1"]) == 0
    assert_matches(np.load(tmp_path / "out.npy"), x, axis=1, op="log_softmax")


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_text_output_round_trips_the_result(tmp_path, rng, dtype):
    x = rng.standard_normal((4, 9)).astype(dtype)
    np.save(tmp_path / "in.npy", x)
    assert main(["run", str(tmp_path / "in.npy"), "-o", str(tmp_path / "a.npy")]) == 0
    assert main(["run", str(tmp_path / "in.npy"), "-o", str(tmp_path / "a.txt")]) == 0
    assert np.array_equal(np.loadtxt(tmp_path / "a.txt").astype(dtype), np.load(tmp_path / "a.npy"))


def test_stdout_when_no_output_file(tmp_path, capsys):
    (tmp_path / "in.txt").write_text("0 0\n")
    assert main(["run", str(tmp_path / "in.txt")]) == 0
    assert capsys.readouterr().out.split() == ["0.5", "0.5"]


def test_one_line_of_text_is_one_row(tmp_path, capsys):
    (tmp_path / "row.txt").write_text("1 2 3\n")
    assert main(["run", str(tmp_path / "row.txt"), "--axis", "1"]) == 0
    out, err = capsys.readouterr()
    assert "shape (1, 3) float64" in err
    lines = out.splitlines()
    assert len(lines) == 1
    assert np.allclose(np.array(lines[0].split(), float), reference.softmax(np.array([1.0, 2.0, 3.0])), rtol=1e-15)
    assert main(["run", str(tmp_path / "row.txt"), "--axis", "0"]) == 0  # down each one-value column
    assert capsys.readouterr().out.split() == ["1", "1", "1"]


def test_one_column_of_text_is_one_value_a_row(tmp_path, capsys):
    (tmp_path / "col.txt").write_text("1\n2\n3\n")
    assert main(["run", str(tmp_path / "col.txt"), "--axis", "0"]) == 0
    y = np.array(capsys.readouterr().out.split(), float)
    assert np.allclose(y, reference.softmax(np.array([1.0, 2.0, 3.0])), rtol=1e-15)


def test_text_values_past_float32_are_read_as_float64_without_warnings(tmp_path):
    (tmp_path / "big.txt").write_text("1e39 0 0\ninf 0 0\nnan 1 2\n-1e300 0 -inf\n")
    done = run_cli("run", str(tmp_path / "big.txt"))
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.decode().splitlines()]
    assert rows[0] == ["1", "0", "0"]
    assert rows[1] == rows[2] == ["nan", "nan", "nan"]  # +inf and NaN rows give NaN, as torch
    assert rows[3] == ["0", "1", "0"]
    assert "Warning" not in done.stderr.decode() and "Traceback" not in done.stderr.decode()


@pytest.mark.parametrize("text, dtype, message", [
    ("1e39 0 0\n", "float32", "the value 1e+39 at index [0, 0] overflows float32 (largest finite 3.40282e+38)"),
    ("0 1\n2 70000\n", "float16", "the value 70000 at index [1, 1] overflows float16 (largest finite 65504)"),
    ("0 1e400\n", None, "the value 1e400 overflows float64"),
])
def test_values_that_overflow_the_dtype_are_refused(tmp_path, capsys, text, dtype, message):
    (tmp_path / "in.txt").write_text(text)
    assert main(["run", str(tmp_path / "in.txt"), *(["--dtype", dtype] if dtype else [])]) == 2
    assert message in one_error_line(capsys.readouterr().err)


def test_float_npy_that_overflows_the_dtype_asked_for_is_refused(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.array([[1.0, 7e4]], np.float32))
    assert main(["run", str(tmp_path / "x.npy"), "--dtype", "float16"]) == 2
    assert "the value 70000 at index [0, 1] overflows float16" in one_error_line(capsys.readouterr().err)


def test_stdin_text(capsys):
    done = run_cli("run", "-", stdin=b"1 2 3\n4 4 4\n")
    assert done.returncode == 0, done.stderr
    rows = [np.array(line.split(), float) for line in done.stdout.decode().splitlines()]
    assert np.allclose(rows[0], reference.softmax(np.array([1.0, 2.0, 3.0])), rtol=1e-15)
    assert np.allclose(rows[1], 1 / 3, rtol=1e-15)
    assert "<stdin>: shape (2, 3) float64" in done.stderr.decode()


def test_stdin_npy(tmp_path):
    x = np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32)
    buf = io.BytesIO()
    np.save(buf, x)
    done = run_cli("run", "-", "--log", "-o", str(tmp_path / "y.npy"), stdin=buf.getvalue())
    assert done.returncode == 0, done.stderr
    assert_matches(np.load(tmp_path / "y.npy"), x, op="log_softmax")


def test_empty_stdin_is_a_clear_error():
    done = run_cli("run", "-", stdin=b"")
    assert done.returncode == 2
    assert "<stdin>: no input" in one_error_line(done.stderr.decode())


def test_large_results_need_a_file_or_an_explicit_stdout(tmp_path, capsys):
    rows = cli.STDOUT_LIMIT // 100 + 1
    np.save(tmp_path / "big.npy", np.zeros((rows, 100), np.float32))
    assert main(["run", str(tmp_path / "big.npy")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"the result holds {rows * 100:,} values" in line and "-o" in line
    assert main(["run", str(tmp_path / "big.npy"), "-o", "-"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == rows and set(np.array(out[0].split(), np.float32)) == {np.float32(1 / 100)}
    np.save(tmp_path / "limit.npy", np.zeros((cli.STDOUT_LIMIT // 100, 100), np.float32))
    assert main(["run", str(tmp_path / "limit.npy")]) == 0  # at the limit: still written to stdout
    assert len(capsys.readouterr().out.splitlines()) == cli.STDOUT_LIMIT // 100


# ----------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "content, message",
    [(None, "no such file"), (b"", "the file is empty"), (b"1 2\n3 x\n", "cannot parse"), (b"\n\n", "no numbers"),
     (b"1 2\n3\n", "cannot parse"), (b"\xff\xfe\x00garbage", "neither a .npy array nor text")],
)
def test_bad_text_files_fail_with_a_clear_error(tmp_path, capsys, content, message):
    path = tmp_path / "in.txt"
    if content is not None:
        path.write_bytes(content)
    assert main(["run", str(path)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(path) in line and message in line


def test_garbage_named_npy_is_not_a_valid_npy_array(tmp_path, capsys):
    (tmp_path / "x.npy").write_bytes(np.random.default_rng(3).bytes(100))
    assert main(["run", str(tmp_path / "x.npy")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "x.npy: not a valid .npy array" in line
    assert "pickle" not in line


def test_truncated_npy_is_not_a_valid_npy_array(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((10, 10), np.float32))
    data = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "x.npy").write_bytes(data[:-40])
    assert main(["run", str(tmp_path / "x.npy")]) == 2
    assert "x.npy: not a valid .npy array" in one_error_line(capsys.readouterr().err)


def test_object_npy_says_it_holds_objects_without_suggesting_pickle(tmp_path, capsys):
    np.save(tmp_path / "obj.npy", np.array([{}, 1], dtype=object), allow_pickle=True)
    assert main(["run", str(tmp_path / "obj.npy")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "obj.npy: holds Python objects" in line and "allow_pickle" not in line


def test_integer_npy_names_the_file_and_the_dtype_option(tmp_path, capsys):
    np.save(tmp_path / "ints.npy", np.arange(6).reshape(2, 3))
    assert main(["run", str(tmp_path / "ints.npy")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "ints.npy: holds int64 values" in line and "--dtype float64" in line
    assert main(["run", str(tmp_path / "ints.npy"), "--dtype", "float32", "-o", str(tmp_path / "y.npy")]) == 0
    assert_matches(np.load(tmp_path / "y.npy"), np.arange(6, dtype=np.float32).reshape(2, 3))


def test_complex_npy_is_refused_even_with_a_dtype(tmp_path, capsys):
    np.save(tmp_path / "c.npy", np.ones((2, 2), np.complex64))
    assert main(["run", str(tmp_path / "c.npy"), "--dtype", "float32"]) == 2
    assert "c.npy: holds complex values" in one_error_line(capsys.readouterr().err)


def test_bfloat16_npy_is_read_with_its_dtype(tmp_path, capsys):
    x = np.random.default_rng(4).standard_normal((3, 8)).astype(ml_dtypes.bfloat16)
    np.save(tmp_path / "bf.npy", x)  # stored as raw 2-byte values
    assert main(["run", str(tmp_path / "bf.npy")]) == 2
    assert "add --dtype bfloat16" in one_error_line(capsys.readouterr().err)
    assert main(["run", str(tmp_path / "bf.npy"), "--dtype", "bfloat16", "-o", str(tmp_path / "y.npy")]) == 0
    assert_matches(np.load(tmp_path / "y.npy").view(ml_dtypes.bfloat16), x)


def test_axis_out_of_range_names_the_accepted_range(tmp_path, capsys):
    (tmp_path / "in.txt").write_text("1 2\n3 4\n")
    assert main(["run", str(tmp_path / "in.txt"), "--axis", "2"]) == 2
    assert "--axis 2 is out of range for an input of shape (2, 2) (accepted: -2 to 1)" in one_error_line(
        capsys.readouterr().err)


# ---------------------------------------------------------------------------------------------- output


def test_output_into_a_missing_directory_fails_before_any_work(tmp_path, capsys):
    (tmp_path / "in.txt").write_text("1 2\n")
    target = tmp_path / "missing" / "out.npy"
    assert main(["run", str(tmp_path / "in.txt"), "-o", str(target)]) == 2
    line = one_error_line(capsys.readouterr().err)  # no header, no timing table: nothing ran
    assert f"the directory {target.parent} does not exist" in line
    assert not target.parent.exists()


def test_output_that_is_a_directory_fails(tmp_path, capsys):
    (tmp_path / "in.txt").write_text("1 2\n")
    assert main(["run", str(tmp_path / "in.txt"), "-o", str(tmp_path)]) == 2
    assert f"-o {tmp_path}: is a directory" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("case", ["missing dir", "directory", "garbage npy", "integer npy", "overflow"])
def test_no_traceback_from_a_shell(tmp_path, case):
    (tmp_path / "small.txt").write_text("1 2 3\n")
    (tmp_path / "x.npy").write_bytes(b"\x00garbage bytes, not an array" * 4)
    np.save(tmp_path / "ints.npy", np.arange(3))
    argv = {"missing dir": ["run", str(tmp_path / "small.txt"), "-o", str(tmp_path / "no" / "dir" / "out.npy")],
            "directory": ["run", str(tmp_path / "small.txt"), "-o", str(tmp_path)],
            "garbage npy": ["run", str(tmp_path / "x.npy")],
            "integer npy": ["run", str(tmp_path / "ints.npy")],
            "overflow": ["run", str(tmp_path / "small.txt"), "--dtype", "float16", "--axis", "5"]}[case]
    done = run_cli(*argv)
    assert done.returncode == 2
    one_error_line(done.stderr.decode())
    assert done.stdout == b""


def test_an_unexpected_failure_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    def broken(x, axis=-1):
        raise RuntimeError("the kernel exploded")

    monkeypatch.setattr(cli, "softmax", broken)
    (tmp_path / "in.txt").write_text("1 2\n")
    assert main(["run", str(tmp_path / "in.txt")]) == 1
    err = capsys.readouterr().err
    assert "unexpected error: RuntimeError: the kernel exploded" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------ help, version


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"portable-softmax {portable_softmax.__version__}\n"


def test_version_from_a_shell():
    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.decode().strip() == f"portable-softmax {portable_softmax.__version__}"


def test_top_level_help_is_plain_text(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "``" not in out
    for command in ("info", "run", "bench"):
        assert f"\n  {command} " in out


@pytest.mark.parametrize("command, helps", [
    ("run", {"--axis": "the axis softmax normalises along", "--dtype": "integer .npy files need it",
             "INPUT": "- reads stdin", "--output": "- for stdout"}),
    ("bench", {"--axis": "the axis normalised along", "--ops": "comma-separated ops to time",
               "--reps": "timed repetitions per figure", "--cpu": "time the CPU backend"}),
])
def test_every_option_has_help(capsys, command, helps):
    assert main([command, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for option, text in helps.items():
        assert option in out and text in out, option


def test_usage_errors_exit_2(capsys):
    assert main(["run", "--dtype", "int8"]) == 2
    assert "invalid choice: 'int8'" in capsys.readouterr().err
    assert main([]) == 2


# ---------------------------------------------------------------------------------------------- info


def test_info_reports_the_backend(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "backend" in out and _probe.host_backend() in out


def _vendor_that_cannot_run() -> tuple[str, str]:
    for vendor in ("hip", "cuda"):
        try:
            _probe.runtime(vendor)
        except _probe.BackendUnavailableError as e:
            return vendor, str(e)
    pytest.skip("both GPU backends can run here")


def test_info_under_a_forced_backend_that_cannot_run_says_why(capsys, monkeypatch):
    vendor, reason = _vendor_that_cannot_run()
    monkeypatch.setenv(_probe.ENV_VAR, vendor)
    assert main(["info"]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert f"none: {_probe.ENV_VAR}={vendor} cannot run here" in out
    assert " ".join(reason.split()) in out
    assert f"without {_probe.ENV_VAR} backend: {_probe._choice(None)[0]}" in out
    assert os.environ[_probe.ENV_VAR] == vendor  # the probe of the fallback left the setting as it was


def test_info_under_an_unknown_backend_names_the_known_ones(capsys, monkeypatch):
    monkeypatch.setenv(_probe.ENV_VAR, "tpu")
    assert main(["info"]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "'tpu' is not one of cuda, hip, cpu" in out


def test_run_under_a_forced_backend_that_cannot_run_is_one_line(tmp_path, capsys, monkeypatch):
    vendor, _ = _vendor_that_cannot_run()
    monkeypatch.setenv(_probe.ENV_VAR, vendor)
    (tmp_path / "in.txt").write_text("1 2\n")
    assert main(["run", str(tmp_path / "in.txt")]) == 2
    assert f"{_probe.ENV_VAR}={vendor} but that backend cannot run here" in one_error_line(capsys.readouterr().err)


def test_info_from_a_shell_under_a_forced_backend_that_cannot_run():
    vendor, _ = _vendor_that_cannot_run()
    done = run_cli("info", env={_probe.ENV_VAR: vendor})
    assert done.returncode == 0 and "cannot run here" in done.stdout.decode()
    assert done.stderr == b""


def test_docstring_examples():
    for module in (cli, _tolerance):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_python_dash_m_runs_the_command():
    """`python -m portable_softmax` is the command where the script is not on PATH."""
    done = subprocess.run([sys.executable, "-m", "portable_softmax", "--version"], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == f"portable-softmax {portable_softmax.__version__}"
