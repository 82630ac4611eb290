package mtpkit.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test

/** Prefix reuse on fake sessions: what the cache holds, where a turn's first call runs, the history's bookkeeping. */
class ConversationTest {
    private val cfg = GenConfig(maxNewTokens = 6)

    private fun engine(target: FakeTarget = FakeTarget(), capacity: Int = 64) =
        Engine(tinyManifest(capacity), target, FakeDrafter(2))

    /** A toy chat template: per message a role marker (90 user, 91 assistant, 92 system), then its numbers (a
     *  word that is not one: 0), or a kept answer's ids; the assistant's marker last, as a generation prompt. */
    private fun render(messages: List<ChatMessage>, kept: Map<Int, List<Int>>): IntArray =
        (messages.withIndex().flatMap { (i, m) ->
            listOf(mapOf("user" to 90, "assistant" to 91, "system" to 92).getValue(m.role)) +
                (kept[i] ?: m.content.split(" ").filter { it.isNotEmpty() }.map { it.toIntOrNull() ?: 0 })
        } + 91).toIntArray()

    private fun decode(ids: List<Int>) = ids.joinToString(" ")

    @Test
    fun heldIsThePromptAndEveryProducedTokenButTheNewest() {
        val e = engine()
        val prompt = intArrayOf(1, 2, 3)
        val out = e.generate(prompt, cfg, reuse = true).map { it.token }.toList()
        assertEquals(prompt.toList() + out.dropLast(1), e.held)
        val next = (e.held + listOf(50, 51)).toIntArray()
        assertEquals(e.held.size, e.cachedPrefix(next)) // all of it: the new ids follow
        assertEquals(e.held.size - 1, e.cachedPrefix(e.held.toIntArray())) // the last id is always run again
        assertEquals(2, e.cachedPrefix(intArrayOf(1, 2, 9, 9, 9))) // rewinds to the first differing id
        e.target.forward(intArrayOf(5), 0) // any other target call overwrites the cache
        assertEquals(0, e.cachedPrefix(next))
        assertEquals(emptyList<Int>(), e.held)
    }

    @Test
    fun aTurnPrefillsOnlyWhatFollowsThePrefixAndGivesAFreshRunsTokens() {
        val target = FakeTarget()
        val conversation = Conversation(engine(target), ::render, ::decode)
        conversation.turn(intArrayOf(1, 2, 3), cfg).toList()
        val second = (conversation.engine.held + listOf(40, 41, 42)).toIntArray()
        val calls = target.calls
        val stats = Stats()
        val got = conversation.turn(second, cfg, stats).map { it.token }.toList()
        val start = second.size - 3 // everything before the three new ids
        assertEquals(start, stats.cachedTokens)
        assertEquals(second.size, stats.promptTokens)
        assertEquals(second.drop(start) to start, target.forwards[calls]) // prefill of the new ids at their position
        assertEquals(engine().generate(second, cfg).map { it.token }.toList(), got)
    }

    @Test
    fun aTurnStoppedEarlyLeavesHeldRight() {
        val e = engine()
        val out = e.generate(intArrayOf(7, 8), cfg, reuse = true).take(3).map { it.token }.toList()
        assertEquals(listOf(7, 8) + out.take(2), e.held)
        assertEquals(4, e.cachedPrefix(intArrayOf(7, 8) + out.take(2) + 99)) // the next turn reuses all of it
    }

    @Test
    fun sendKeepsTheHistoryAndDropOldestDropsWholeTurns() {
        val conversation = Conversation(engine(capacity = 24), ::render, ::decode, dropOldest = true)
        conversation.messages.add(ChatMessage("system", "5"))
        val first = conversation.send("1 2 3", cfg).map { it.token }.toList()
        assertEquals(listOf("system", "user", "assistant"), conversation.messages.map { it.role })
        assertEquals(decode(first), conversation.messages.last().content)
        val firstPrompt = conversation.promptIds
        val stats = Stats()
        conversation.send("4", cfg, stats).toList()
        assertEquals(firstPrompt.size + first.size - 1, stats.cachedTokens) // the first turn and its answer reused
        conversation.send("6 7 8", cfg).toList() // 26 ids: over 24 with 6 new tokens, 15 without the first turn
        assertEquals(1, conversation.dropped)
        assertEquals(listOf("system", "user", "assistant", "user", "assistant"), conversation.messages.map { it.role })
        assertEquals("4", conversation.messages[1].content)
    }

    @Test
    fun aTurnThatCannotFitNamesBothWaysOutAndNeverHappened() {
        val conversation = Conversation(engine(capacity = 20), ::render, ::decode)
        conversation.send("1 2 3", cfg).toList()
        val e = assertThrows(ConversationFullError::class.java) { conversation.send("4 5 6 7", cfg) }
        assertTrue("dropOldest" in e.message!! && "reset" in e.message!!, e.message)
        assertEquals(2, conversation.messages.size)
        conversation.reset()
        val alone = assertThrows(ConversationFullError::class.java) { conversation.send((1..15).joinToString(" "), cfg) }
        assertTrue("alone" in alone.message!!, alone.message)
    }

    @Test
    fun aGeneratedAnswerRendersAsItsIdsAndAnEditedOneAsText() {
        // the answer's text does not render back to its ids ("w7" reads as 0): only the kept ids reuse the answer
        val conversation = Conversation(engine(), ::render, { ids -> ids.joinToString(" ") { "w$it" } })
        val first = conversation.send("1 2 3", cfg).map { it.token }.toList()
        assertEquals(mapOf(1 to first), conversation.kept()) // six tokens, no stop token among them
        val firstPrompt = conversation.promptIds
        val stats = Stats()
        conversation.send("4", cfg, stats).toList()
        assertEquals(firstPrompt.size + first.size - 1, stats.cachedTokens)
        conversation.messages[1] = ChatMessage("assistant", "5 6")
        assertEquals(listOf(3), conversation.kept().keys.toList()) // the edited answer renders as text
    }
}
