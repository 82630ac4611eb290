package mtpkit.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test

class SpeculativeDecoderTest {
    private val prompt = intArrayOf(1, 2, 3)
    private val noEos = emptySet<Int>()

    private fun run(correctSteps: Int, schedule: DraftSchedule, maxNew: Int, eos: Set<Int> = noEos,
                    target: FakeTarget = FakeTarget(), stats: Stats = Stats()): List<Emitted> =
        speculativeGenerate(target, FakeDrafter(correctSteps), prompt, schedule, maxNew, eos, stats).toList()

    @Test
    fun allDraftsAccepted() {
        val stats = Stats()
        val target = FakeTarget()
        val out = run(correctSteps = 99, DraftSchedule("constant", 4), maxNew = 21, target = target, stats = stats)
        assertEquals(chain(3, 21), out.map { it.token })
        assertEquals(stats.drafted, stats.accepted)
        assertEquals(List(4) { 1.0 }, stats.acceptanceByPosition)
        assertEquals(1 + stats.rounds, target.calls) // prefill + one verify per round
        assertEquals(listOf(3, 8, 13, 18), target.forwards.drop(1).map { it.second }) // pos += k + 1
        assertEquals(16, out.count { it.fromDraft })
    }

    @Test
    fun noDraftsAccepted() {
        val target = FakeTarget()
        val stats = Stats()
        val out = run(correctSteps = 0, DraftSchedule("constant", 3), maxNew = 10, target = target, stats = stats)
        assertEquals(chain(3, 10), out.map { it.token }) // lossless: the target's token replaces each wrong draft
        assertTrue(out.none { it.fromDraft })
        assertEquals(10, target.calls) // exactly one new token per target call
        assertEquals(0, stats.accepted)
        assertEquals((3 until 12).toList(), target.forwards.drop(1).map { it.second }) // rejected slots rewound
    }

    @Test
    fun partialAcceptRewindsPos() {
        val target = FakeTarget()
        val out = run(correctSteps = 2, DraftSchedule("constant", 4), maxNew = 13, target = target)
        assertEquals(chain(3, 13), out.map { it.token })
        assertEquals(listOf(3, 6, 9, 12), target.forwards.drop(1).map { it.second }) // pos += n + 1 with n = 2
        assertEquals(listOf(false, true, true, false), out.take(4).map { it.fromDraft })
    }

    @Test
    fun eosInsideAcceptedRunStops() {
        val expected = chain(3, 30)
        val eos = expected[5] // the 4th draft of the first round (token 0 comes from prefill)
        val out = run(correctSteps = 99, DraftSchedule("constant", 8), maxNew = 30, eos = setOf(eos))
        assertEquals(expected.take(6), out.map { it.token })
        assertTrue(out.last().fromDraft)
    }

    @Test
    fun maxTokensReachedMidRound() {
        val stats = Stats()
        val out = run(correctSteps = 99, DraftSchedule("constant", 4), maxNew = 4, stats = stats)
        assertEquals(chain(3, 4), out.map { it.token })
        assertEquals(listOf(2), stats.drafts.map { it.size }) // drafts clipped to what is left, never past max
        val stats7 = Stats()
        val out7 = run(correctSteps = 99, DraftSchedule("constant", 4), maxNew = 7, stats = stats7)
        assertEquals(chain(3, 7), out7.map { it.token }) // the last token comes from a verify with no drafts
        assertEquals(1, stats7.rounds)
    }

    @Test
    fun heuristicScheduleGrowsUpToCap() {
        val stats = Stats()
        run(correctSteps = 99, DraftSchedule("heuristic", 2, maxDraft = 7), maxNew = 40, stats = stats)
        assertEquals(listOf(2, 4, 6, 7, 7, 7), stats.drafts.map { it.size }.take(6))
    }

    @Test
    fun heuristicScheduleShrinksToOne() {
        val stats = Stats()
        run(correctSteps = 0, DraftSchedule("heuristic", 4), maxNew = 8, stats = stats)
        assertEquals(listOf(4, 3, 2, 1, 1, 1), stats.drafts.map { it.size })
    }

    @Test
    fun constantScheduleNeverChanges() {
        val schedule = DraftSchedule("constant", 3)
        schedule.update(accepted = 3, drafted = 3)
        schedule.update(accepted = 0, drafted = 3)
        assertEquals(3, schedule.k)
        assertThrows(IllegalArgumentException::class.java) { DraftSchedule("fastest", 3) }
        assertThrows(IllegalArgumentException::class.java) { DraftSchedule("constant", 0) }
    }

    @Test
    fun plainEqualsSpeculativeAndStatsSayWhetherDrafterRan() {
        val manifest = tinyManifest(capacity = 64)
        val spec = Stats()
        val plain = Stats()
        val withMtp = Engine(manifest, FakeTarget(), FakeDrafter(2)).generate(prompt, GenConfig(20), spec).toList()
        val noMtp = Engine(manifest, FakeTarget(), FakeDrafter(2)).generate(prompt, GenConfig(20, mtp = false), plain).toList()
        assertEquals(noMtp.map { it.token }, withMtp.map { it.token })
        assertTrue(spec.drafterRan)
        assertFalse(plain.drafterRan)
        assertEquals(2.5, spec.tokensPerTargetCall) // prefill + 7 verifies (6 rounds of n = 2, one with no drafts)
        assertEquals(1.0, plain.tokensPerTargetCall)
    }

    @Test
    fun engineRefusesWhatTheCacheCannotHold() {
        val engine = Engine(tinyManifest(capacity = 16), FakeTarget(), FakeDrafter(0))
        val e = assertThrows(IllegalArgumentException::class.java) { engine.generate(prompt, GenConfig(14)) }
        assertTrue("--max-cache-len" in e.message!!)
    }
}
