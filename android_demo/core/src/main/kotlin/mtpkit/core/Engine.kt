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

/** A target/drafter pair opened once; generate() per request (mirrors runtime/engine.py, greedy only). */
class Engine(val manifest: ModelManifest, val target: Target, val drafter: Drafter) {
    fun schedule(cfg: GenConfig): DraftSchedule {
        val k = cfg.numAssistantTokens ?: manifest.numAssistantTokens
        return DraftSchedule(cfg.schedule ?: manifest.schedule, k, maxOf(cfg.maxDraft, k))
    }

    /** Yields tokens as they are produced; [stats] is updated after every token, so a UI can show it live. */
    fun generate(promptIds: IntArray, cfg: GenConfig, stats: Stats = Stats()): Sequence<Emitted> {
        require(promptIds.isNotEmpty()) { "the prompt is empty; pass some text" }
        require(promptIds.size + cfg.maxNewTokens <= manifest.capacity) {
            "prompt (${promptIds.size} tokens) + maxNewTokens (${cfg.maxNewTokens}) exceeds the export's KV capacity of " +
                "${manifest.capacity} tokens; shorten them or re-export with a larger --max-cache-len"
        }
        val tokens = if (cfg.mtp) {
            speculativeGenerate(target, drafter, promptIds, schedule(cfg), cfg.maxNewTokens, manifest.eosIds, stats)
        } else {
            plainGenerate(target, promptIds, cfg.maxNewTokens, manifest.eosIds)
        }
        return timed(tokens, stats)
    }

    private fun timed(tokens: Sequence<Emitted>, stats: Stats): Sequence<Emitted> = sequence {
        val t0 = target.calls
        val d0 = drafter.calls
        val start = System.nanoTime()
        for (item in tokens) {
            val now = System.nanoTime() - start
            if (stats.newTokens == 0) stats.ttftNanos = now
            stats.newTokens++
            stats.totalNanos = now
            stats.targetCalls = target.calls - t0
            stats.drafterCalls = drafter.calls - d0
            yield(item)
        }
    }
}
