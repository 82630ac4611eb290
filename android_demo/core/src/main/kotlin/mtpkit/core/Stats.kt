package mtpkit.core

/** Run statistics (mirrors runtime/stats.py): acceptance overall and by draft position, calls, throughput. */
class Stats {
    var rounds = 0
        private set
    var drafted = 0
        private set
    var accepted = 0
        private set
    val draftedAt = ArrayList<Int>() // index i: rounds that drafted position i+1
    val acceptedAt = ArrayList<Int>() // index i: rounds whose draft i+1 was accepted
    val drafts = ArrayList<List<Int>>() // every round's drafted tokens
    var promptTokens = 0
    var cachedTokens = 0 // leading prompt ids whose K/V an earlier turn left in the cache: not prefilled again
    var targetCalls = 0
    var drafterCalls = 0
    var newTokens = 0
    var ttftNanos = 0L
    var totalNanos = 0L

    fun round(drafted: Int, accepted: Int, drafts: IntArray) {
        rounds++
        this.drafts.add(drafts.toList())
        this.drafted += drafted
        this.accepted += accepted
        while (draftedAt.size < drafted) {
            draftedAt.add(0)
            acceptedAt.add(0)
        }
        for (i in 0 until drafted) {
            draftedAt[i]++
            if (i < accepted) acceptedAt[i]++
        }
    }

    val acceptanceRate: Double? get() = if (drafted > 0) accepted.toDouble() / drafted else null

    val acceptanceByPosition: List<Double> get() = draftedAt.indices.map { acceptedAt[it].toDouble() / draftedAt[it] }

    /** The one definition (runtime/stats.py tokens_per_target_call): the prefill call counts, it makes the first token. */
    val tokensPerTargetCall: Double? get() = if (targetCalls > 0) newTokens.toDouble() / targetCalls else null

    /** Decode throughput after the first token, as runtime/stats.py reports tokens_per_s. */
    val tokensPerSecond: Double?
        get() = if (newTokens > 1 && totalNanos > ttftNanos) (newTokens - 1) * 1e9 / (totalNanos - ttftNanos) else null

    /** Whether speculation actually ran: a drafter that was silently disabled leaves this false. */
    val drafterRan: Boolean get() = drafterCalls > 0
}
