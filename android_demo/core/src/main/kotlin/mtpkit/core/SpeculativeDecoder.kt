package mtpkit.core

/**
 * The draft-verify loop (one screen), the plain baseline and draft-length schedules; mirrors runtime/speculative.py.
 *
 * Per round: the drafter proposes k tokens from the target's activations and store-layer K/V, the target
 * verifies [newest, d1..dk] in one call, greedy acceptance keeps a prefix plus one target token. Rollback of the
 * rejected drafts is `pos` moving forward by only n + 1: their K/V slots are simply overwritten later.
 */

val SCHEDULES = listOf("constant", "heuristic")

/** One generated token; fromDraft is true when a drafter proposal was accepted for it. */
data class Emitted(val token: Int, val fromDraft: Boolean)

/** constant: always k. heuristic: +2 after a round where every draft was accepted, -1 otherwise (>= 1). */
class DraftSchedule(val kind: String = "constant", k: Int = 4, val maxDraft: Int = 16) {
    var k = k
        private set

    init {
        require(kind in SCHEDULES) { "unknown schedule '$kind'; use one of ${SCHEDULES.joinToString()}" }
        require(k >= 1) { "number of draft tokens must be >= 1 (got $k); run plainGenerate to disable drafting" }
        require(maxDraft >= k) { "maxDraft $maxDraft is below the initial draft length $k" }
    }

    fun update(accepted: Int, drafted: Int) {
        if (kind == "heuristic") k = if (accepted == drafted) minOf(maxDraft, k + 2) else maxOf(1, k - 1)
    }
}

/**
 * Greedy speculative decoding: yields tokens until EOS or [maxNewTokens]; the output equals the target's greedy
 * output. The cache already holds prompt[0:start] (a conversation's earlier turns): only the rest is prefilled.
 */
fun speculativeGenerate(target: Target, drafter: Drafter, prompt: IntArray, schedule: DraftSchedule, maxNewTokens: Int,
                        eosIds: Set<Int>, stats: Stats = Stats(), start: Int = 0): Sequence<Emitted> = sequence {
    val prefill = target.forward(prompt.copyOfRange(start, prompt.size), start)
    var pos = prompt.size // the newest token sits at pos, not yet in the cache
    var token = argmax(prefill.logits.last())
    var h = prefill.activations.last()
    var produced = 1
    yield(Emitted(token, false))
    while (produced < maxNewTokens && token !in eosIds) {
        val k = minOf(schedule.k, maxNewTokens - produced - 1) // never draft past maxNewTokens
        val drafts = draft(drafter, target.drafterView(pos), token, h, pos, k)
        val verified = target.forward(intArrayOf(token, *drafts), pos)
        val (n, next) = verify(verified.logits, drafts)
        if (k > 0) {
            stats.round(k, n, drafts)
            schedule.update(n, k)
        }
        for (d in drafts.take(n)) {
            yield(Emitted(d, true))
            if (d in eosIds) return@sequence
        }
        yield(Emitted(next, false))
        pos += n + 1
        token = next
        h = verified.activations[n]
        produced += n + 1
    }
}

/** k drafter steps at a constant position, each fed its own greedy token and projected activations. */
private fun draft(drafter: Drafter, view: DrafterView, token: Int, h: FloatArray, pos: Int, k: Int): IntArray {
    val drafts = IntArray(k)
    var (last, act) = token to h
    for (i in 0 until k) {
        val out = drafter.step(last, act, pos, view)
        last = argmax(out.logits)
        act = out.activations
        drafts[i] = last
    }
    return drafts
}

/** Greedy acceptance: the accepted prefix length n and the target's token after it (correction or bonus). */
private fun verify(logits: List<FloatArray>, drafts: IntArray): Pair<Int, Int> {
    for ((i, d) in drafts.withIndex()) {
        val best = argmax(logits[i])
        if (d != best) return i to best
    }
    return drafts.size to argmax(logits[drafts.size])
}

/** The baseline: one target call per token on the same graphs (prompt[0:start] already cached). */
fun plainGenerate(target: Target, prompt: IntArray, maxNewTokens: Int, eosIds: Set<Int>,
                  start: Int = 0): Sequence<Emitted> = sequence {
    var pos = prompt.size
    var token = argmax(target.forward(prompt.copyOfRange(start, prompt.size), start).logits.last())
    yield(Emitted(token, false))
    repeat(maxNewTokens - 1) {
        if (token in eosIds) return@sequence
        token = argmax(target.forward(intArrayOf(token), pos).logits.last())
        pos += 1
        yield(Emitted(token, false))
    }
}

/** Index of the largest logit; ties go to the lowest index, as numpy.argmax does. */
fun argmax(logits: FloatArray): Int {
    var best = 0
    for (i in 1 until logits.size) if (logits[i] > logits[best]) best = i
    return best
}
