package mtpkit.desktop

import mtpkit.core.Conversation
import mtpkit.core.Engine
import mtpkit.core.GenConfig
import mtpkit.core.Json
import mtpkit.core.ModelManifest
import mtpkit.core.OnnxPair
import mtpkit.core.Stats
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.TestInstance
import java.io.File

/**
 * A multi-turn conversation on the exported trained tiny pair: the Kotlin conversation state, fed the prompt ids
 * the Python runtime rendered for each turn (mtpkit.runtime.conversation.Conversation, greedy), gives Python's
 * output ids turn by turn while prefilling only what is new. -Dmtpkit.conversation names the JSON that
 * desktop/src/test/python/conversation_reference.py wrote (android_demo/test.sh runs it).
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class ConversationParityTest {
    private fun prop(name: String) = System.getProperty(name) ?: error("set -D$name (android_demo/test.sh does)")
    private val manifest = ModelManifest.load(File(prop("mtpkit.export")))
    private val session = OrtGraphSession(manifest, prop("mtpkit.ortLib"), threads = 1)
    private val reference = Json.parse(File(prop("mtpkit.conversation")).readText()) as Map<*, *>
    private val cfg = GenConfig((reference["max_new_tokens"] as Long).toInt())

    /** One turn of the reference: the rendered history's ids, Python's answer and its cached prefix length. */
    private class Turn(json: Any?) {
        private val map = json as Map<*, *>
        private fun ints(key: String) = (map[key] as List<*>).map { (it as Long).toInt() }
        val prompt = ints("prompt_ids").toIntArray()
        val output = ints("output_ids")
        val cached = (map["cached_tokens"] as Long).toInt()
    }

    private val turns = (reference["turns"] as List<*>).map(::Turn)
    private val edited = Turn(reference["edited"])

    private fun engine(): Engine = OnnxPair(manifest, session).let { Engine(manifest, it.target, it.drafter) }

    /** A conversation of ids only: the reference gives every turn's rendered prompt, so render is never called. */
    private fun conversation() = Conversation(engine(), { _, _ -> error("the test feeds rendered ids") }, { it.toString() })

    private fun tokens(run: Sequence<mtpkit.core.Emitted>) = run.map { it.token }.toList()

    @Test
    fun everyTurnGivesPythonsIdsAndReusesThePreviousTurns() {
        assertTrue(turns.size >= 3 && turns.all { it.output.size >= 8 }, "the reference is too short to prove reuse")
        val conversation = conversation()
        for ((i, turn) in turns.withIndex()) {
            val stats = Stats()
            assertEquals(turn.output, tokens(conversation.turn(turn.prompt, cfg, stats)), "turn ${i + 1}")
            assertEquals(turn.cached, stats.cachedTokens, "turn ${i + 1}: cached prefix differs from Python's")
            if (i > 0) {
                val before = turns[i - 1].prompt.size + turns[i - 1].output.size - 1 // the answer renders as its ids
                assertTrue(stats.cachedTokens >= before,
                    "turn ${i + 1} reused ${stats.cachedTokens} ids, less than the previous prompt and answer ($before)")
            } else {
                assertEquals(0, stats.cachedTokens)
            }
        }
    }

    @Test
    fun anEditedEarlierTurnGivesAFreshRunsIdsReusingWhatTheCacheStillHolds() {
        val conversation = conversation()
        for (turn in turns) conversation.turn(turn.prompt, cfg).toList()
        val held = conversation.engine.held
        assertEquals(turns.last().prompt.toList() + turns.last().output.dropLast(1), held)
        val differs = held.indices.first { it >= edited.prompt.size || held[it] != edited.prompt[it] }
        assertTrue(differs < turns[1].prompt.size, "the edit should fall inside the second turn")
        // the rewind goes to the first differing id where every sliding-window ring still holds the window before
        // it; else (the ring keeps the last answer) the turn prefills again
        val resumable = conversation.engine.target.resumable(differs)
        val stats = Stats()
        val got = tokens(conversation.turn(edited.prompt, cfg, stats))
        assertEquals(if (resumable) differs else 0, stats.cachedTokens)
        assertEquals(tokens(engine().generate(edited.prompt, cfg)), got) // a fresh Kotlin run: nothing reused
        assertEquals(edited.output, got)
        assertEquals(edited.cached, stats.cachedTokens)
    }
}
