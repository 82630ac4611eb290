package mtpkit.demo

import mtpkit.core.ChatMessage
import mtpkit.core.Json
import mtpkit.core.ModelManifest
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.io.File
import java.nio.file.Files

/**
 * The app's Kotlin rendering of the history (ChatTurns, compiled here on its own: the rest of the app needs
 * Android) against the Python runtime's Jinja rendering of the tiny export's chat template, for every turn of the
 * reference conversation (-Dmtpkit.conversation; android_demo/test.sh writes it) and the edited one.
 */
class ChatTurnsTest {
    private fun prop(name: String) = System.getProperty(name) ?: error("set -D$name (android_demo/test.sh does)")
    private val manifest = ModelManifest.load(File(prop("mtpkit.export")))
    private val reference = Json.parse(File(prop("mtpkit.conversation")).readText()) as Map<*, *>

    @Test
    fun rendersEveryTurnAsThePythonRuntimeRendersTheTemplate() {
        val turns = (reference["turns"] as List<*>) + listOf(reference["edited"])
        for ((i, turn) in turns.withIndex()) {
            val t = turn as Map<*, *>
            val messages = (t["messages"] as List<*>).map { m ->
                (m as Map<*, *>).let { ChatMessage(it["role"] as String, it["content"] as String) }
            }
            // turn i answers i earlier exchanges and a user message; the edited one replaces the last answer
            assertEquals(2 * minOf(i, turns.size - 2) + 1, messages.size, "turn ${i + 1}: messages")
            assertEquals(t["rendered"], reference["bos_token"] as String + ChatTurns.render(messages), "turn ${i + 1}")
            assertEquals(t["gemma4_rendered"], ChatTurns.render(messages, ChatTurns.GEMMA4), "turn ${i + 1}: Gemma 4")
        }
    }

    @Test
    fun rendersASystemTurnAndStripsAnAnswersThoughtInGemma4sFormat() {
        val extra = reference["gemma4_extra"] as Map<*, *>
        val messages = (extra["messages"] as List<*>).map { m ->
            (m as Map<*, *>).let { ChatMessage(it["role"] as String, it["content"] as String) }
        }
        assertEquals(extra["rendered"], ChatTurns.render(messages, ChatTurns.GEMMA4))
        val chars = { text: String -> text.map { it.toString() } }
        // the thought would be stripped from the text, so the answer's ids do not stand in for it
        assertEquals(chars(ChatTurns.render(messages, ChatTurns.GEMMA4)),
            ChatTurns.spliced(messages, mapOf(2 to listOf("x")), ChatTurns.GEMMA4, chars))
    }

    @Test
    fun acceptsTheExportsTemplateAndGemma4sAndRefusesOneItCannotRender() {
        assertEquals(ChatTurns.GEMMA, ChatTurns.check(manifest))
        val dir = Files.createTempDirectory("chat-template").toFile()
        try {
            File(dir, "g4.jinja").writeText(File(prop("mtpkit.gemma4Template")).readText())
            assertEquals(ChatTurns.GEMMA4, ChatTurns.check(manifest.copy(root = dir, chatTemplateFile = "g4.jinja")))
            File(dir, "t.jinja").writeText("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}{% endfor %}")
            val other = manifest.copy(root = dir, chatTemplateFile = "t.jinja")
            val e = assertThrows(IllegalArgumentException::class.java) { ChatTurns.check(other) }
            assertTrue("<start_of_turn>" in e.message!! && "<|turn>" in e.message!!, e.message)
            assertThrows(IllegalStateException::class.java) { ChatTurns.check(manifest.copy(chatTemplateFile = null)) }
        } finally {
            dir.deleteRecursively()
        }
    }

    @Test
    fun splicesAKeptAnswersIdsWhereItsTrimmedTextStands() {
        val messages = listOf(ChatMessage("user", "a"), ChatMessage("assistant", "\n b \n"), ChatMessage("user", "c"))
        val chars = { text: String -> text.map { it.toString() } } // a toy tokenizer: one id per character
        assertEquals(chars(ChatTurns.render(messages)), ChatTurns.spliced(messages, emptyMap(), ChatTurns.GEMMA, chars))
        val kept = listOf("\n", " ", "b", " ", "\n") // the answer as generated, before the template's trim
        val spliced = ChatTurns.spliced(messages, mapOf(1 to kept), ChatTurns.GEMMA, chars)
        val head = chars("<start_of_turn>user\na<end_of_turn>\n<start_of_turn>model\n")
        assertEquals(head + kept + chars("<end_of_turn>\n<start_of_turn>user\nc<end_of_turn>\n<start_of_turn>model\n"),
            spliced)
    }
}
