"""An operator script whose reader closes stdout early (``api_keys list --json | head``)
ends quietly: a tester saw a ``BrokenPipeError`` traceback (``qimpl.scripts.piped``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from qimpl.scripts import EXIT_BROKEN_PIPE

LOUD = ("import sys\n"
        "from qimpl.scripts import piped\n"
        "def main():\n"
        "    for i in range(200000):\n"
        "        print('{\"key\": %d}' % i)\n"
        "    return 0\n"
        "sys.exit(piped(main))\n")


@pytest.mark.req("R-OPS-4")
def test_a_reader_that_goes_away_ends_the_script_without_a_traceback() -> None:
    proc = subprocess.Popen([sys.executable, "-c", LOUD], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10)  # what `head -c 10` reads, then it closes the pipe
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=30) == EXIT_BROKEN_PIPE
    assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.req("R-OPS-4")
def test_a_reader_that_reads_everything_sees_the_script_s_own_code() -> None:
    done = subprocess.run([sys.executable, "-c", LOUD.replace("200000", "3")], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0 and done.stdout.count("key") == 3 and not done.stderr
