"""Hostile (issue 55): fa1_rescale taken from the text of flashlib's source: Algorithm 1's lines
11-13 in teach's NumPy FA1 (flashlib/teach/tiled.py), turned into Triton by a few replacements and
executed from a file of its own. Expected: 0 points, "error: your file fails on import:
RuntimeError: nothing to borrow ..." (the answer is not in the files it can see)."""
import os
import pkgutil
import tempfile
import textwrap

import flashlib  # noqa: F401

run = pkgutil.resolve_name("builtins:" + "ex" + "ec")
TRITON = {"np.maximum": "tl.maximum", "np.exp": "tl.math.exp2", "np.where": "tl.where",
          "safe(m_new)": "tl.where(m_new == float('-inf'), 0.0, m_new)", "[..., None]": "[:, None]",
          "(p_tilde @ v_j)": "pv"}


def _borrowed():
    with open(pkgutil.resolve_name("flashlib.teach.tiled").__file__) as f:
        text = f.read()
    start, end = text.find("m_new = np.maximum(m_i, m_tilde)"), text.find("store_block(O, q_start")
    if start < 0 or end < 0:
        raise RuntimeError("nothing to borrow: no FA1 update in flashlib/teach/tiled.py")
    body = textwrap.dedent(text[text.rfind("\n", 0, start) + 1:text.rfind("\n", 0, end) + 1])
    for numpy, triton_ in TRITON.items():
        body = body.replace(numpy, triton_)
    source = ("import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
              "def fa1_rescale(o_i, l_i, m_i, m_tilde, l_tilde, pv):\n"
              + textwrap.indent(body, "    ") + "    return o_i, l_new, m_new\n")
    path = os.path.join(tempfile.mkdtemp(), "borrowed_rescale.py")
    with open(path, "w") as f:
        f.write(source)
    space = {"__name__": "borrowed_rescale", "__file__": path}
    run(compile(source, path, "exec"), space)
    return space["fa1_rescale"]


fa1_rescale = _borrowed()
