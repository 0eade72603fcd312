"""Integer options take ASCII digits only (issue 11): typer's conversion alone would read `1_0` as 10,
` 12` and `12.0` as 12 and accept other scripts' digits."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from kistexp.cli import app
from kistexp.commands import OptionValueError, _takes_ints


def _int_params(command, path=()):
    for p in getattr(command, "params", ()):
        desc = getattr(p, "type_descriptor", None)
        if desc is not None and _takes_ints(desc.annotation):
            yield " ".join(path), p
    for name, sub in getattr(command, "commands", {}).items():
        yield from _int_params(sub, (*path, name))


def test_every_integer_option_refuses_underscores_spaces_decimals_and_other_digits():
    params = list(_int_params(typer.main.get_command(app)))
    names = {(where, p.opts[0] if p.opts else p.name) for where, p in params}
    assert ("run", "--interval") in names and ("authorities whatif", "--n-authorities") in names
    assert len(params) >= 30
    for _where, p in params:
        for bad in ("1_0", "١٢", " 12", "12.0", "1e3", "0x10", "", "1" * 19):
            with pytest.raises(OptionValueError, match=r"not a whole number \(ASCII digits 0-9"):
                p.process_value(None, bad)
            with pytest.raises(OptionValueError):
                p.process_value(None, [bad])


def test_an_underscore_in_a_count_is_a_one_line_error_and_plain_digits_pass():
    env = dict(os.environ, PYTHONPATH=str(Path.cwd()))
    bad = subprocess.run([sys.executable, "-m", "kistexp", "authorities", "whatif", "--n-authorities", "1_0",
                          "--json"], capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr == ("kistexp: error: --n-authorities '1_0': not a whole number (ASCII digits 0-9 with an "
                          "optional sign; no '_', spaces, decimals or other scripts' digits)\n")
    good = subprocess.run([sys.executable, "-m", "kistexp", "authorities", "whatif", "--n-authorities", "10",
                           "--json"], capture_output=True, text=True, env=env)
    assert good.returncode == 0 and '"n_authorities": 10' in good.stdout
