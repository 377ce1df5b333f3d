# SPDX-License-Identifier: MIT
"""The README's Python quick start, run as written."""

import os
import re

import numpy as np
import pytest

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def test_readme_quick_start(capsys):
    pytest.importorskip("sklearn")
    if not os.path.exists(README):
        pytest.skip("README.md is not beside the tests")
    text = open(README, encoding="utf-8").read()
    section = text[text.index("\n## Python\n"):]
    section = section[:section.index("\n## ", 5)]
    code = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(code) == 1 and len(code[0].strip().splitlines()) == 6
    scope = {}
    exec(compile(code[0], "README.md", "exec"), scope)
    np.testing.assert_array_equal(scope["ids"][:, 0], np.arange(5))  # each query is a reference
    assert scope["graph"].shape == (1000, 10)
    assert (scope["graph"] != np.arange(1000)[:, None]).all()
    assert capsys.readouterr().out.startswith("[0 1 2 3 4]")
