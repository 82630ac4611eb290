package mtpkit.core

/** One generation request; null fields take the drafter's generation_config values recorded in the manifest. */
data class GenConfig(
    val maxNewTokens: Int = 64,
    val mtp: Boolean = true, // false: plain decoding on the same target graph
    val numAssistantTokens: Int? = null,
    val schedule: String? = null, // constant | heuristic
    val maxDraft: Int = 16, // the most drafts a round may take (the heuristic schedule's bound)
) {
    init {
        require(maxNewTokens >= 1) { "maxNewTokens must be >= 1 (got $maxNewTokens)" }
        require(numAssistantTokens == null || numAssistantTokens >= 1) { "numAssistantTokens must be >= 1; set mtp = false to disable drafting" }
        require(maxDraft >= 1) { "maxDraft must be >= 1 (got $maxDraft)" }
    }
}

/**
 * A target/drafter pair opened once; generate() per request (mirrors runtime/engine.py, greedy only). The engine
 * tracks which ids its cache holds ([held]), so a conversation's next turn prefills only what is new (reuse).
 */
class Engine(val manifest: ModelManifest, val target: Target, val drafter: Drafter) {
    // the ids whose K/V the cache holds at positions 0.., and the target's call count when they were left there:
    // any target call since (another engine on the same pair, a tool) voids them
    private val heldIds = ArrayList<Int>()
    private var heldCalls = -1

    /** The ids the cache holds at positions 0.. (empty once another target call has overwritten it). */
    val held: List<Int> get() = if (heldCalls == target.calls) heldIds.toList() else emptyList()

    fun schedule(cfg: GenConfig): DraftSchedule {
        val k = cfg.numAssistantTokens ?: manifest.numAssistantTokens
        return DraftSchedule(cfg.schedule ?: manifest.schedule, k, maxOf(cfg.maxDraft, k))
    }

    /**
     * How many leading ids of [promptIds] the cache holds already: the longest common prefix with what the last
     * generate left there, less one: the last id is always run, its logits give the first token. Positions are a
     * rewind: what lies past the prefix is overwritten. Nothing either where the cache no longer holds what a call
     * at the prefix's end reads ([Target.resumable]).
     */
    fun cachedPrefix(promptIds: IntArray): Int {
        if (heldCalls != target.calls) return 0
        var n = 0
        while (n < heldIds.size && n < promptIds.size && heldIds[n] == promptIds[n]) n++
        n = maxOf(0, minOf(n, promptIds.size - 1))
        return if (target.resumable(n)) n else 0 // a sliding-window ring may no longer hold the window before n
    }

    /**
     * Yields tokens as they are produced; [stats] is updated after every token, so a UI can show it live. reuse:
     * prefill only what follows the prefix the cache holds from the previous generate ([cachedPrefix]); the
     * tokens are the same as without.
     */
    fun generate(promptIds: IntArray, cfg: GenConfig, stats: Stats = Stats(), reuse: Boolean = false): Sequence<Emitted> {
        require(promptIds.isNotEmpty()) { "the prompt is empty; pass some text" }
        require(promptIds.size + cfg.maxNewTokens <= manifest.capacity) {
            "prompt (${promptIds.size} tokens) + maxNewTokens (${cfg.maxNewTokens}) exceeds the export's KV capacity of " +
                "${manifest.capacity} tokens; shorten them or re-export with a larger --max-cache-len"
        }
        val schedule = if (cfg.mtp) schedule(cfg) else null
        return sequence {
            val start = if (reuse) cachedPrefix(promptIds) else 0
            target.keepFrom(promptIds.size) // a sliding-window ring keeps the answer, not the whole prompt
            stats.promptTokens = promptIds.size
            stats.cachedTokens = start
            val tokens = if (schedule != null) {
                speculativeGenerate(target, drafter, promptIds, schedule, cfg.maxNewTokens, manifest.eosIds, stats, start)
            } else {
                plainGenerate(target, promptIds, cfg.maxNewTokens, manifest.eosIds, start)
            }
            yieldAll(timed(promptIds, start, tokens, stats))
        }
    }

    /**
     * Fills stats and keeps [held] current before every token: a caller that stops reading leaves it right (a
     * sequence's finally never runs then). Every produced token but the newest has its K/V cached.
     */
    private fun timed(prompt: IntArray, start: Int, tokens: Sequence<Emitted>, stats: Stats): Sequence<Emitted> = sequence {
        val t0 = target.calls
        val d0 = drafter.calls
        hold(prompt, start)
        var previous: Int? = null
        val begin = System.nanoTime()
        for (item in tokens) {
            if (previous == null) hold(prompt, prompt.size) else heldIds.add(previous)
            heldCalls = target.calls
            previous = item.token
            val now = System.nanoTime() - begin
            if (stats.newTokens == 0) stats.ttftNanos = now
            stats.newTokens++
            stats.totalNanos = now
            stats.targetCalls = target.calls - t0
            stats.drafterCalls = drafter.calls - d0
            yield(item)
        }
    }

    /** Before the first token, the cache holds prompt[0:count] (the prefix a reuse kept). */
    private fun hold(prompt: IntArray, count: Int) {
        heldIds.clear()
        for (i in 0 until count) heldIds.add(prompt[i])
        heldCalls = target.calls
    }
}
