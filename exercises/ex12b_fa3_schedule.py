"""Exercise 12b (lesson 12): FlashAttention-3's schedule, as a task graph for the simulator.

FlashAttention-3 (Shah et al., 2024) hides the softmax's exponentials under matmuls. You write the
consumer warpgroups' side of one query tile's loop as a graph of tasks, each naming the tasks it
waits for; lesson 12's simulator (flashlib.teach.schedule) runs it and the grader reads the
timeline. Write ``fa3_schedule(n_blocks, consumers)``.

The tile meets ``n_blocks`` key blocks, j = 0 .. n_blocks - 1. A producer warpgroup (supplied, not
yours) loads them into a ring of two shared-memory slots: its tasks are "producer.load_k[j]" and
"producer.load_v[j]". Each consumer warpgroup w ("wg1", and "wg2" when consumers is 2; each owns
its own query rows) has three tasks per key block:

    "wg{w}.gemm0[j]"     S_j = Q K_j^T            a wgmma on the tensor cores
    "wg{w}.softmax[j]"   P_j from S_j             on the exp units: the row max m_j (from m_{j-1}
                                                  and S_j), P_j = exp(S_j - m_j), the row sum
    "wg{w}.gemm1[j]"     O += P_j V_j             a wgmma on the tensor cores

Return a list of (name, deps), one entry for every task of every consumer warpgroup (no producer
task), in the order the warpgroups issue them (with two consumers: wg1's part of an iteration,
then wg2's); ``deps`` is a tuple of the names of the tasks that must end before this one starts
(producer tasks included). The simulator starts a task once its deps have ended and its unit
(copy engine, tensor cores, exp units: one task at a time each) is free, ties going to the task
earlier in the list. A dep you leave out lets a task run before its input is ready (a hazard); a
dep the algorithm does not have costs overlap. What makes a task wait:

- its inputs: K_j and V_j loaded, S_j, P_j, the running max and sum of softmax_{j-1}, and O, which
  each PV adds to;
- its warpgroup's program (FA3's Algorithm 2, section 3.2, each warpgroup on its own): the prologue
  issues S_0, waits for it and computes softmax_0. Iteration j (1 .. n_blocks - 1) issues S_j, then
  issues the deferred O += P_{j-1} V_{j-1} (both asynchronous: issuing does not wait), then waits
  for S_j, computes softmax_j, and waits for P_{j-1} V_{j-1} before the next iteration begins. The
  epilogue issues the last O += P V and waits for it. A task the program issues cannot start
  before the waits that come before it in the program have returned, and a warpgroup's wgmmas run
  one after another in the order it issued them;
- with two consumers, ping-pong barriers (section 3.1): a warpgroup's GEMMs between two of its
  softmaxes form one turn (the prologue's S_0 is its first turn, the epilogue's last PV its last),
  and the turns alternate: wg1's first turn, wg2's first, wg1's second, wg2's second, ... The
  first GEMM of a turn waits for the last GEMM of the turn before it (the other warpgroup's).

Example of the format, one warpgroup, one key block: [("wg1.gemm0[0]", ("producer.load_k[0]",)),
("wg1.softmax[0]", ("wg1.gemm0[0]",)), ("wg1.gemm1[0]", ("wg1.softmax[0]", "producer.load_v[0]",
"wg1.gemm0[0]"))].

Check it: ``flashlib check ex12b``.
"""


def fa3_schedule(n_blocks, consumers=1):
    """The consumer warpgroups' tasks of FA3's forward loop: a list of (name, deps), issue order."""
    raise NotImplementedError('ex12b: your code goes here, then run `flashlib check ex12b`')
