"""Exact optimal transport for many small dense problems (numba, nogil): the exact-W2 solver.

POT's network simplex costs ~0.1 ms per 32 x 32 problem through its Python entry point, and
exact W2 on pre-filtered candidates solves ~10^5 of them per layer pair.  Here one compiled call
solves a whole batch, releases the GIL (threads run batches side by side), and starts each
problem from a near-optimal basis, so few pivots are needed.

The algorithm is the transportation simplex (MODI):

1. Start: the *row-minimum* rule (each row, in order, ships to its cheapest columns with demand
   left).  Every allocation exhausts a row or a column, so the allocated cells form a forest;
   zero-flow cells join its trees into a spanning tree (a basis of n + m - 1 cells).
2. Potentials u, v with u_i + v_j = C_ij on the basis (one pass over the tree from row 0).
3. Pricing: the cell of most negative reduced cost C_ij - u_i - v_j enters (Dantzig's rule);
   none below ``-tol`` means optimal.
4. The entering cell closes one cycle with the tree; flow theta moves around it, the cell of
   the cycle's minus edges with the least flow leaves.

A problem that has not reached optimality after ``max_iter`` pivots (degenerate cycling, never
seen on real problems) returns NaN; :func:`transport_costs` callers re-solve those with POT.
"""

from __future__ import annotations

import threading

import numpy as np


def _find(parent, x):
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def _link(adj_n, adj_e, deg, r, c, k):
    """Add tree edge ``k`` between nodes ``r`` and ``c`` to both adjacency lists."""
    adj_n[r, deg[r]] = c
    adj_e[r, deg[r]] = k
    deg[r] += 1
    adj_n[c, deg[c]] = r
    adj_e[c, deg[c]] = k
    deg[c] += 1


def _least_cost_start(a, b, C, ei, ej, x):
    """Step 1 of :func:`transport_cost`: the least-cost rule (the cheapest cell whose row and
    column both have mass left ships what it can), with each row's cheapest open column cached.
    Every allocation exhausts a row or a column, so the allocated cells form a forest.  Fills
    ``ei``, ``ej``, ``x`` from 0 and returns how many cells it allocated."""
    n, m = a.shape[0], b.shape[0]
    ne = n + m - 1
    s = a.copy()
    d = b.copy()
    e = 0
    rmin = np.empty(n)
    rarg = np.empty(n, np.int64)
    for i in range(n):
        bc = np.inf
        bj = -1
        for j in range(m):
            if C[i, j] < bc:
                bc = C[i, j]
                bj = j
        rmin[i] = bc
        rarg[i] = bj
    while e < ne:
        bi = -1
        bc = np.inf
        for i in range(n):
            if s[i] > 0.0 and rmin[i] < bc:
                bc = rmin[i]
                bi = i
        if bi < 0:
            break  # rows empty (a rounding-level residual of demand is dropped)
        j = rarg[bi]
        f = min(s[bi], d[j])
        ei[e] = bi
        ej[e] = j
        x[e] = f
        e += 1
        s[bi] -= f
        d[j] -= f
        if d[j] <= 0.0:  # column full: rows that pointed at it find their next cheapest open column
            for i in range(n):
                if rarg[i] == j and s[i] > 0.0:
                    bc2 = np.inf
                    bj = -1
                    for jj in range(m):
                        if d[jj] > 0.0 and C[i, jj] < bc2:
                            bc2 = C[i, jj]
                            bj = jj
                    rmin[i] = bc2
                    rarg[i] = bj
                    if bj < 0:
                        s[i] = 0.0  # no open column: a rounding-level residual, dropped
    return e


def _join_forest(n, m, ei, ej, x, e):
    """Step 1, continued: join the forest's trees into one spanning tree (a basis of n + m - 1
    cells) with zero-flow cells, each joining another tree to row 0's; returns the cell count."""
    N = n + m
    uf = np.arange(N)
    for k in range(e):
        ra, rb = _find(uf, ei[k]), _find(uf, n + ej[k])
        if ra != rb:
            uf[ra] = rb
    root0 = _find(uf, 0)
    c0 = -1
    for j in range(m):
        if _find(uf, n + j) == root0:
            c0 = j
            break
    for node in range(N):
        r = _find(uf, node)
        if r == root0:
            continue
        if c0 < 0 and node >= n:  # row 0's tree has no column yet: join this column to row 0
            ei[e], ej[e] = 0, node - n
            c0 = node - n
        elif node < n:
            ei[e], ej[e] = node, c0
        else:
            ei[e], ej[e] = 0, node - n
        x[e] = 0.0
        e += 1
        uf[r] = root0
        root0 = _find(uf, 0)
    return e


def _transport_cost(a, b, C, max_iter=10_000, start=0, block=4):
    """Optimal transport cost min <P, C> over couplings P of ``a`` (n,) and ``b`` (m,).

    ``a``, ``b``: strictly positive float64 weights of equal total mass; ``C``: (n, m) float64.
    Returns (cost, pivots); cost is NaN if optimality was not reached within ``max_iter`` pivots.
    """
    n, m = a.shape[0], b.shape[0]
    N = n + m
    ne = N - 1
    ei = np.empty(ne, np.int64)
    ej = np.empty(ne, np.int64)
    x = np.zeros(ne)
    cmax = 0.0
    for i in range(n):
        for j in range(m):
            if abs(C[i, j]) > cmax:
                cmax = abs(C[i, j])
    tol = 1e-12 * max(cmax, 1e-300)
    # 1. start: a least-cost forest, joined into a spanning tree by zero-flow cells
    _join_forest(n, m, ei, ej, x, _least_cost_start(a, b, C, ei, ej, x))
    # adjacency lists of the tree (row nodes 0..n-1, column nodes n..n+m-1)
    cap = max(n, m) + 1
    adj_n = np.empty((N, cap), np.int64)
    adj_e = np.empty((N, cap), np.int64)
    deg = np.zeros(N, np.int64)
    for k in range(ne):
        _link(adj_n, adj_e, deg, ei[k], n + ej[k], k)
    parent = np.empty(N, np.int64)
    pedge = np.empty(N, np.int64)
    depth = np.empty(N, np.int64)
    queue = np.empty(N, np.int64)
    u = np.empty(n)
    v = np.empty(m)
    side_q = np.empty(N, np.int64)
    side_p = np.empty(N, np.int64)
    # 2. potentials over the tree, breadth first from row 0 (after a pivot: only over the subtree
    # that moved, from the entering cell's end inside it)
    parent[0] = -1
    pedge[0] = -1
    depth[0] = 0
    u[0] = 0.0
    queue[0] = 0
    row0 = 0
    for it in range(max_iter + 1):
        head, tail = 0, 1
        while head < tail:
            node = queue[head]
            head += 1
            for t in range(deg[node]):
                k = adj_e[node, t]
                if k == pedge[node]:
                    continue
                nbr = adj_n[node, t]
                if nbr >= n:
                    v[nbr - n] = C[node, nbr - n] - u[node]
                else:
                    u[nbr] = C[nbr, node - n] - v[node - n]
                parent[nbr] = node
                pedge[nbr] = k
                depth[nbr] = depth[node] + 1
                queue[tail] = nbr
                tail += 1
        # 3. pricing: block search (rows from where the last search stopped; the best cell of the
        # first block of ``block`` rows that holds a negative reduced cost enters)
        best = -tol
        bp, bq = -1, -1
        for t in range(n):
            i = (row0 + t) % n
            ui = u[i]
            for j in range(m):
                r = C[i, j] - ui - v[j]
                if r < best:
                    best = r
                    bp, bq = i, j
            if bp >= 0 and (t + 1) % block == 0:
                row0 = i + 1
                break
        if bp < 0:
            cost = 0.0
            for k in range(ne):
                cost += x[k] * C[ei[k], ej[k]]
            return cost, it
        if it == max_iter:
            break
        # 4. the cycle: tree paths from the entering column and row up to their common ancestor;
        # on each side the edges at even distance from the end lose theta, the others gain it
        pa, qa = bp, n + bq
        nq, npp = 0, 0
        while depth[qa] > depth[pa]:
            side_q[nq] = pedge[qa]
            nq += 1
            qa = parent[qa]
        while depth[pa] > depth[qa]:
            side_p[npp] = pedge[pa]
            npp += 1
            pa = parent[pa]
        while pa != qa:
            side_q[nq] = pedge[qa]
            nq += 1
            qa = parent[qa]
            side_p[npp] = pedge[pa]
            npp += 1
            pa = parent[pa]
        theta = np.inf
        leave = -1
        on_p = False  # the leaving edge lies on the row's side: the row's end of the subtree moves
        for t in range(0, nq, 2):
            if x[side_q[t]] < theta:
                theta = x[side_q[t]]
                leave = side_q[t]
        for t in range(0, npp, 2):
            if x[side_p[t]] < theta:
                theta = x[side_p[t]]
                leave = side_p[t]
                on_p = True
        for t in range(nq):
            x[side_q[t]] += -theta if t % 2 == 0 else theta
        for t in range(npp):
            x[side_p[t]] += -theta if t % 2 == 0 else theta
        # swap the leaving cell for the entering one in the tree
        for end in (ei[leave], n + ej[leave]):
            for t in range(deg[end]):
                if adj_e[end, t] == leave:
                    deg[end] -= 1
                    adj_n[end, t] = adj_n[end, deg[end]]
                    adj_e[end, t] = adj_e[end, deg[end]]
                    break
        ei[leave] = bp
        ej[leave] = bq
        x[leave] = theta
        r, c = bp, n + bq
        _link(adj_n, adj_e, deg, r, c, leave)
        # the moved subtree hangs from the entering cell: walk it from its end inside
        w, z = (r, c) if on_p else (c, r)
        parent[w] = z
        pedge[w] = leave
        depth[w] = depth[z] + 1
        if w >= n:
            v[w - n] = C[z, w - n] - u[z]
        else:
            u[w] = C[w, z - n] - v[z - n]
        queue[0] = w
    return np.nan, max_iter


def _transport_costs(M, A, B, max_iter=10_000, start=0, block=4):
    """Optimal transport costs of a batch: ``M`` (P, k, k') float32 or float64 costs (widened to
    float64 here), ``A`` (P, k), ``B`` (P, k')
    non-negative weights (zeros = padding, dropped; each row renormalised to mass 1 in float64).

    Returns (P,) float64 costs (NaN for a problem with an all-zero side or not solved within
    ``max_iter`` pivots) and (P,) int64 pivot counts.
    """
    P, k, kb = M.shape
    out = np.empty(P)
    piv = np.zeros(P, np.int64)
    ia = np.empty(k, np.int64)
    ib = np.empty(kb, np.int64)
    for p in range(P):
        na, nb_ = 0, 0
        sa, sb = 0.0, 0.0
        for t in range(k):
            if A[p, t] > 0:
                ia[na] = t
                na += 1
                sa += A[p, t]
        for t in range(kb):
            if B[p, t] > 0:
                ib[nb_] = t
                nb_ += 1
                sb += B[p, t]
        if na == 0 or nb_ == 0:
            out[p] = np.nan
            continue
        a = np.empty(na)
        b = np.empty(nb_)
        C = np.empty((na, nb_))
        for r in range(na):
            a[r] = A[p, ia[r]] / sa
            for c in range(nb_):
                C[r, c] = M[p, ia[r], ib[c]]
        for c in range(nb_):
            b[c] = B[p, ib[c]] / sb
        out[p], piv[p] = _transport_cost(a, b, C, max_iter, start, block)
    return out, piv


def _quantile_cells(Pz, index, w, n_quantiles, out):
    """Cell averages of 1-D weighted quantile functions (the sliced embedding's kernel).

    ``Pz`` (n, L) float32: projections of n points on L directions; ``index`` (F, k) int64: each
    measure's support (rows of Pz); ``w`` (F, k) weights (zeros = padding).  For measure f and
    direction l, with F^-1 the quantile function of the projected measure and cells
    [q/Q, (q+1)/Q), writes ``out[f, l, q]`` = Q * integral of F^-1 over cell q (float32 out
    (F, L, Q)).  Supports are sorted stably (insertion sort: k is small), weights renormalised.
    """
    F, k = index.shape
    L = Pz.shape[1]
    Q = n_quantiles
    vals = np.empty(k)
    order = np.empty(k, np.int64)
    cw = np.empty(k)
    ci = np.empty(k)
    for f in range(F):
        for l in range(L):
            for i in range(k):
                vals[i] = Pz[index[f, i], l]
                order[i] = i
            for i in range(1, k):
                o = order[i]
                v = vals[o]
                j = i - 1
                while j >= 0 and vals[order[j]] > v:
                    order[j + 1] = order[j]
                    j -= 1
                order[j + 1] = o
            tot = 0.0
            for i in range(k):
                tot += w[f, order[i]]
            tot = max(tot, 1e-300)
            c1, c2 = 0.0, 0.0
            for i in range(k):
                wi = w[f, order[i]] / tot
                c1 += wi
                c2 += wi * vals[order[i]]
                cw[i] = c1
                ci[i] = c2
            # I(t) = ci[j-1] + x_j (t - cw[j-1]) for the first j with cw[j] >= t (the last if none)
            j = 0
            prev = 0.0
            for q in range(Q + 1):
                t = q / Q
                while j < k and cw[j] < t:
                    j += 1
                jj = min(j, k - 1)
                I = (ci[jj - 1] if jj > 0 else 0.0) + vals[order[jj]] * (t - (cw[jj - 1] if jj > 0 else 0.0))
                if q > 0:
                    out[f, l, q - 1] = (I - prev) * Q
                prev = I


# The kernels above are plain Python until first use: numba (about 0.6 s to import) compiles them then,
# so `saeot --help` and the numpy-only paths never load it.  Callees are compiled with their callers
# (numba resolves a kernel's globals when it compiles it, and by then every name here is a dispatcher).
_KERNELS = ("_find", "_link", "_least_cost_start", "_join_forest", "_transport_cost", "_transport_costs",
            "_quantile_cells")
_compile_lock = threading.Lock()
_compiled = False


def _jit() -> None:
    global _compiled
    with _compile_lock:
        if not _compiled:
            import numba as nb  # lazy: numba (~0.6 s) loads on the first solve, not at `saeot --help`

            for name in _KERNELS:
                globals()[name] = nb.njit(nogil=True, cache=True)(globals()[name])
            _compiled = True


def transport_cost(a, b, C, max_iter=10_000, start=0, block=4):
    """Optimal transport cost min <P, C> over couplings P of ``a`` (n,) and ``b`` (m,) (compiled).

    ``a``, ``b``: strictly positive float64 weights of equal total mass; ``C``: (n, m) float64.
    Returns (cost, pivots); cost is NaN if optimality was not reached within ``max_iter`` pivots.
    """
    _compiled or _jit()
    return _transport_cost(a, b, C, max_iter, start, block)


def transport_costs(M, A, B, max_iter=10_000, start=0, block=4):
    """Many problems in one compiled call (GIL released): see :func:`_transport_costs`."""
    _compiled or _jit()
    return _transport_costs(M, A, B, max_iter, start, block)


def quantile_cells(Pz, index, w, n_quantiles, out):
    """Cell-averaged quantiles per feature and direction, written into ``out`` (compiled): see
    :func:`_quantile_cells`."""
    _compiled or _jit()
    return _quantile_cells(Pz, index, w, n_quantiles, out)
