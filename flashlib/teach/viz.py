"""Figures and widgets for the lessons: rooflines, softmax overflow, online state, tiles, IO sweeps.

Each ``plot_*`` function draws one figure (about a screen) and returns the matplotlib ``Figure``;
pass ``ax=`` to draw into an existing axes instead. The ``step_through_*`` functions wrap a plot in
an ipywidgets slider for JupyterLab; they need a live kernel, so every lesson also draws the static
figure. matplotlib and ipywidgets are imported inside the functions, so ``import flashlib`` stays
fast and works without them. No global state: styles are passed per call, never set with rcParams.

Limits: made for small, readable inputs (a vector of tens of numbers, a score matrix of tens of
tiles); the tile figures follow flashlib's bottom-right causal rule (query i sees key j iff
j <= i + Nk - Nq), as in flash-attn and ``flashlib.reference.causal_mask``.
"""
import math

import numpy as np

__all__ = [
    "plot_roofline", "plot_softmax_overflow", "plot_online_state", "step_through_online_state",
    "plot_lse_merge", "tile_states", "plot_tiles", "step_through_tiles", "plot_io_sweep",
]


def figure_axes(ax, figsize):
    """Use the caller's axes, or make a new figure with one axes."""
    import matplotlib.pyplot as plt
    if ax is not None:
        return ax.figure, ax
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    return fig, ax


def detached(fig):
    """Detach a figure from pyplot so it is shown once (by the returned object), not twice."""
    import matplotlib.pyplot as plt
    plt.close(fig)
    return fig


# ---------------------------------------------------------------------------------------------
# lesson 00: the roofline
# ---------------------------------------------------------------------------------------------

def plot_roofline(peak_flops, bandwidth, points=None, *, title=None, ax=None):
    """Log-log roofline: attainable FLOP/s = min(peak_flops, intensity * bandwidth).

    peak_flops: FLOP/s; bandwidth: bytes/s. points: {label: intensity} (FLOP per byte) placed on
    the roof, or {label: (intensity, achieved_flops)} to place a measured point below it.
    Left of the ridge point (peak_flops / bandwidth) a kernel is memory bound, right of it
    compute bound.
    """
    points = {} if points is None else points
    ridge = peak_flops / bandwidth
    intensities = [p[0] if isinstance(p, tuple) else p for p in points.values()]
    lo = min([ridge / 100] + [i / 3 for i in intensities])
    hi = max([ridge * 100] + [i * 3 for i in intensities])
    x = np.logspace(math.log10(lo), math.log10(hi), 200)
    roof = np.minimum(peak_flops, x * bandwidth)

    fig, ax = figure_axes(ax, (7, 4))
    ax.loglog(x, roof, color="black", lw=2)
    ax.axvspan(lo, ridge, color="tab:blue", alpha=0.08)
    ax.axvspan(ridge, hi, color="tab:red", alpha=0.08)
    ax.axvline(ridge, color="gray", ls=":")
    ax.text(ridge, peak_flops * 1.15, f"ridge {ridge:.0f} FLOP/B", ha="center", fontsize=8)
    ax.text(lo * 1.3, peak_flops * 0.5, "memory bound", color="tab:blue")
    ax.text(ridge * 1.3, peak_flops * 0.02, "compute bound", color="tab:red")
    for (label, p), marker in zip(points.items(), "osD^v<>ph*"):
        intensity, achieved = p if isinstance(p, tuple) else (p, min(peak_flops, p * bandwidth))
        ax.plot([intensity], [achieved], marker, ms=8, label=f"{label} ({intensity:.3g} FLOP/B)")
    ax.set_xlim(lo, hi)
    ax.set_ylim(top=peak_flops * 2)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved to or from memory: HBM on a GPU)")
    ax.set_ylabel("attainable FLOP/s")
    ax.set_title("roofline" if title is None else title)
    if points:
        ax.legend(fontsize=8, loc="lower right")
    return detached(fig)


# ---------------------------------------------------------------------------------------------
# lesson 01: naive softmax overflows
# ---------------------------------------------------------------------------------------------

def plot_softmax_overflow(*, dtype=np.float32, ax=None):
    """Naive vs safe softmax of [c, c - 1, c - 2] as the shift c grows, in ``dtype``.

    The true answer does not depend on c. Naive softmax computes exp(c), which is inf once
    c > log(largest float) = 88.72 for float32 (11.09 for float16), and inf / inf = nan.
    """
    from .softmax import naive_softmax, safe_softmax
    limit = float(np.log(np.finfo(dtype).max))
    c = np.linspace(limit - 8, limit + 4, 241).astype(dtype)
    x = (c[:, None] - np.arange(3, dtype=dtype)[None, :]).astype(dtype)  # (shifts, 3)
    with np.errstate(over="ignore", invalid="ignore"):
        naive = naive_softmax(x)[:, 0]
    safe = safe_softmax(x)[:, 0]

    fig, ax = figure_axes(ax, (7, 3.5))
    ax.plot(c, safe, lw=4, alpha=0.5, label="safe softmax (subtract the max)")
    ax.plot(c, naive, "--", color="black", label="naive softmax exp(x) / sum exp(x)")
    bad = ~np.isfinite(naive)
    if bad.any():
        ax.axvspan(float(c[bad][0]), float(c[-1]), color="tab:red", alpha=0.15,
                   label="naive gives nan")
    ax.axvline(limit, color="tab:red", ls=":")
    ax.text(limit, 0.1, f" log(max {np.dtype(dtype).name}) = {limit:.2f}", color="tab:red")
    ax.set_ylim(0, 1)
    ax.set_xlabel("c, with x = [c, c-1, c-2]")
    ax.set_ylabel("softmax(x)[0]")
    ax.set_title(f"softmax in {np.dtype(dtype).name}: same answer for every c, until exp overflows")
    ax.legend(fontsize=8, loc="center left")
    return detached(fig)


# ---------------------------------------------------------------------------------------------
# lesson 02: the online (max, sum) state
# ---------------------------------------------------------------------------------------------

def _online_trace(x, block_size):
    """(m, d') after each block of a 1-D x, computed the way online_normalizer does."""
    from .softmax import merge_states
    m, d, trace = -np.inf, 0.0, []
    for start in range(0, len(x), block_size):
        block = x[start:start + block_size]
        m_block = float(block.max())
        d_block = float(np.exp(block - m_block).sum())
        m_new, d_new = merge_states(np.float64(m), np.float64(d), m_block, d_block)
        trace.append((start, float(m), float(m_new), float(d_new)))
        m, d = float(m_new), float(d_new)
    return trace  # [(block start, m before, m after, d' after)]


def plot_online_state(x, block_size, *, upto=None, axes=None):
    """Two panels: the input in blocks with the running max, and the running sum d'.

    x: 1-D array; the first ``upto`` blocks (all by default) have arrived. Top: x as bars
    (arrived blocks coloured), the running max m as a step line. Bottom: d' after each block,
    and what each d' would be if all arrived x were re-summed against the current m: they agree,
    which is the point of the rescale d' <- d' * exp(m_old - m_new).
    """
    import matplotlib.pyplot as plt
    x = np.asarray(x, dtype=np.float64).ravel()
    trace = _online_trace(x, block_size)
    n_blocks = len(trace)
    upto = n_blocks if upto is None else max(0, min(int(upto), n_blocks))
    if axes is None:
        fig, axes = plt.subplots(2, 1, figsize=(8, 5), sharex=False, layout="constrained")
    fig = axes[0].figure
    top, bottom = axes

    arrived = np.zeros(len(x), dtype=bool)
    arrived[:upto * block_size] = True
    colors = np.where(arrived, "tab:blue", "lightgray")
    top.bar(np.arange(len(x)), x, color=colors)
    for b in range(1, n_blocks):
        top.axvline(b * block_size - 0.5, color="gray", lw=0.5)
    if upto:
        starts = [t[0] for t in trace[:upto]] + [min(len(x), upto * block_size)]
        maxima = [t[2] for t in trace[:upto]]
        top.step(np.array(starts) - 0.5, maxima + maxima[-1:], where="post", color="tab:red",
                 lw=2, label="running max m")
        for b, (start, m_old, m_new, _) in enumerate(trace[:upto]):
            if b and m_new > m_old:
                top.annotate("max grows: rescale d'", (start - 0.5, m_new), fontsize=7,
                             xytext=(0, 8), textcoords="offset points", color="tab:red")
        top.legend(fontsize=8, loc="lower right")
    top.set_title(f"{upto} of {n_blocks} blocks of {block_size} have arrived")
    top.set_ylabel("x")

    blocks = np.arange(1, n_blocks + 1)
    d_online = np.array([t[3] for t in trace])
    d_resum = np.array([np.exp(x[:b * block_size] - trace[b - 1][2]).sum() for b in blocks])
    bottom.plot(blocks[:upto], d_online[:upto], "o-", label="online d' (rescaled each block)")
    bottom.plot(blocks[:upto], d_resum[:upto], "x", ms=10, color="black",
                label="sum exp(x_seen - m), recomputed")
    bottom.set_xlim(0.5, n_blocks + 0.5)
    bottom.set_ylim(0, max(1.0, float(d_online.max())) * 1.15)
    bottom.set_xlabel("blocks arrived")
    bottom.set_ylabel("d'")
    bottom.legend(fontsize=8, loc="upper left")
    return detached(fig)


def step_through_online_state(x, block_size):
    """An ipywidgets slider over the number of arrived blocks, redrawing plot_online_state."""
    import ipywidgets as widgets
    from IPython.display import display
    n_blocks = math.ceil(len(np.ravel(x)) / block_size)

    def show(blocks):
        display(plot_online_state(x, block_size, upto=blocks))

    slider = widgets.IntSlider(value=1, min=0, max=n_blocks, description="blocks")
    return widgets.interactive(show, blocks=slider)


# ---------------------------------------------------------------------------------------------
# lesson 03: merging partial attention by lse
# ---------------------------------------------------------------------------------------------

def plot_lse_merge(scores, split, *, ax=None):
    """One query's attention weights computed in two halves, then merged by their lse.

    scores: 1-D scaled scores of one query against all keys; split: where the keys are cut.
    Each half's softmax is normalised on its own (weights sum to 1 within the half); multiplying
    half i by exp(lse_i - lse) turns it into the matching slice of the full softmax.
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    halves = [np.arange(split), np.arange(split, len(s))]
    lse_halves = [np.logaddexp.reduce(s[idx]) for idx in halves]
    lse = np.logaddexp(*lse_halves)
    fig, ax = figure_axes(ax, (8, 3.5))
    for idx, lse_i, color in zip(halves, lse_halves, ("tab:blue", "tab:orange")):
        local = np.exp(s[idx] - lse_i)
        ax.bar(idx, local, color=color, alpha=0.35, width=0.9,
               label=f"keys {idx[0]}..{idx[-1]}: own softmax, lse={lse_i:.2f}")
        ax.bar(idx, local * np.exp(lse_i - lse), color=color, width=0.5,
               label=f"  x exp(lse_i - lse) = {np.exp(lse_i - lse):.2f}")
    ax.plot(np.arange(len(s)), np.exp(s - lse), "k_", ms=12, mew=2, label="full softmax")
    ax.axvline(split - 0.5, color="gray", ls="--")
    ax.set_xlabel("key index")
    ax.set_ylabel("attention weight")
    ax.set_title(f"two halves merged by lse: lse = log(exp({lse_halves[0]:.2f}) + "
                 f"exp({lse_halves[1]:.2f})) = {lse:.2f}")
    ax.legend(fontsize=7, loc="upper right")
    return detached(fig)


# ---------------------------------------------------------------------------------------------
# lesson 04: tiles of the score matrix
# ---------------------------------------------------------------------------------------------

def tile_states(Nq, Nk, block_q, block_k, *, causal=False):
    """Status of every (query block, key block) tile: 0 skipped, 1 partly masked, 2 full.

    Returns an int array (ceil(Nq / block_q), ceil(Nk / block_k)). With bottom-right causal
    masking, query i sees key j iff j <= i + Nk - Nq; a tile none of whose queries sees any of
    its keys is skipped (never loaded), a tile cut by the diagonal is computed with a mask.
    """
    n_q, n_k = math.ceil(Nq / block_q), math.ceil(Nk / block_k)
    states = np.full((n_q, n_k), 2, dtype=np.int64)
    if not causal:
        return states
    offset = Nk - Nq
    for bi in range(n_q):
        q_first, q_last = bi * block_q, min(Nq, (bi + 1) * block_q) - 1
        for bj in range(n_k):
            k_first, k_last = bj * block_k, min(Nk, (bj + 1) * block_k) - 1
            if k_first > q_last + offset:      # even the last query sees none of these keys
                states[bi, bj] = 0
            elif k_last > q_first + offset:    # some query misses some key: mask inside
                states[bi, bj] = 1
    return states


def _visit_order(states, order):
    """Tiles in the order the algorithm touches them: FA1 KV-outer, FA2 Q-outer; skips dropped."""
    n_q, n_k = states.shape
    if order == "fa1":
        tiles = [(bi, bj) for bj in range(n_k) for bi in range(n_q)]
    elif order == "fa2":
        tiles = [(bi, bj) for bi in range(n_q) for bj in range(n_k)]
    else:
        raise ValueError(f"order must be 'fa1' (key blocks outer) or 'fa2' (query blocks "
                         f"outer), got {order!r}")
    return [t for t in tiles if states[t] > 0]


def plot_tiles(Nq, Nk, block_q, block_k, *, causal=False, order="fa2", step=None, ax=None):
    """The score matrix S (Nq x Nk) cut into tiles, numbered in the order they are computed.

    order: "fa1" (Algorithm 1: outer loop over key blocks) or "fa2" (outer loop over query
    blocks). Skipped causal tiles are shaded grey, tiles cut by the diagonal are hatched.
    step: highlight the step-th visited tile (0-based) and grey out the ones not reached yet.
    """
    from matplotlib.patches import Rectangle
    states = tile_states(Nq, Nk, block_q, block_k, causal=causal)
    visits = _visit_order(states, order)
    rank = {tile: i for i, tile in enumerate(visits)}
    fig, ax = figure_axes(ax, (5.5, 5.5 * Nq / Nk + 0.8))
    for (bi, bj), state in np.ndenumerate(states):
        x0, y0 = bj * block_k, bi * block_q
        w, h = min(block_k, Nk - x0), min(block_q, Nq - y0)
        done = state > 0 and (step is None or rank[(bi, bj)] <= step)
        face = "0.75" if state == 0 else ("tab:green" if done else "white")
        ax.add_patch(Rectangle((x0, y0), w, h, facecolor=face, alpha=0.5 if done else 1.0,
                               edgecolor="black", hatch="//" if state == 1 else None))
        if state > 0:
            ax.text(x0 + w / 2, y0 + h / 2, str(rank[(bi, bj)]), ha="center", va="center",
                    fontsize=8)
        if step is not None and state > 0 and rank[(bi, bj)] == step:
            ax.add_patch(Rectangle((x0, y0), w, h, fill=False, edgecolor="tab:red", lw=3))
    if causal:
        # the boundary of the bottom-right causal mask: key j = query i + Nk - Nq
        i = np.array([0, Nq])
        ax.plot(i + Nk - Nq, i, color="tab:red", lw=1)
    ax.set_xlim(0, Nk)
    ax.set_ylim(Nq, 0)
    ax.set_aspect("equal")
    ax.set_xlabel(f"keys (Nk={Nk}, block_k={block_k})")
    ax.set_ylabel(f"queries (Nq={Nq}, block_q={block_q})")
    outer = "key blocks outer (FA1)" if order == "fa1" else "query blocks outer (FA2)"
    skipped = int((states == 0).sum())
    ax.set_title(f"{outer}: {len(visits)} tiles computed, {skipped} skipped", fontsize=10)
    return detached(fig)


def step_through_tiles(Nq, Nk, block_q, block_k, *, causal=False, order="fa2"):
    """An ipywidgets slider over the visit order of plot_tiles."""
    import ipywidgets as widgets
    from IPython.display import display
    states = tile_states(Nq, Nk, block_q, block_k, causal=causal)
    n_visits = len(_visit_order(states, order))

    def show(step):
        display(plot_tiles(Nq, Nk, block_q, block_k, causal=causal, order=order, step=step))

    slider = widgets.IntSlider(value=0, min=0, max=max(0, n_visits - 1), description="tile")
    return widgets.interactive(show, step=slider)


# ---------------------------------------------------------------------------------------------
# lessons 00 and 04: bytes moved as a function of SRAM size or tile size
# ---------------------------------------------------------------------------------------------

def plot_io_sweep(x, series, *, xlabel, ylabel="bytes moved to/from HBM", title=None,
                  logx=True, ax=None):
    """Log-log lines of bytes (or any count) against x, one per entry of series {label: ys}."""
    fig, ax = figure_axes(ax, (7, 4))
    for (label, ys), marker in zip(series.items(), "osD^v<>"):
        ax.plot(x, ys, marker + "-", label=label)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return detached(fig)
