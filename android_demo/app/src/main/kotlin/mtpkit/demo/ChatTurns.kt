package mtpkit.demo

import mtpkit.core.ChatMessage
import mtpkit.core.ModelManifest

/**
 * The history as text in Gemma's turn format, what the export's chat template renders for it with
 * add_generation_prompt (bos is prepended as an id by the caller, as the template's {{ bos_token }} encodes):
 * `<start_of_turn>ROLE\nCONTENT<end_of_turn>\n` per message (assistant is "model", content trimmed as the template's
 * `| trim`), then `<start_of_turn>model\n`. There is no Jinja on the device, so an export whose template does not
 * use these markers is refused rather than rendered differently from the Python runtime.
 */
object ChatTurns {
    private val markers = listOf("<start_of_turn>", "<end_of_turn>")

    /** Throws with the reason when this export's chat template is not one the app can render. */
    fun check(manifest: ModelManifest) {
        val name = manifest.chatTemplateFile
            ?: error("this export has no chat template, which the chat needs; re-export from a checkpoint with one")
        val template = manifest.path(name).readText()
        require(markers.all { it in template }) {
            "the chat template $name does not use Gemma's ${markers.joinToString(" / ")} turns, the only format the " +
                "app renders; chat with this export through the Python runtime (mtpkit chat)"
        }
    }

    fun render(messages: List<ChatMessage>): String = spliced(messages, emptyMap()) { listOf(it) }.joinToString("")

    /**
     * The history's ids with each kept answer (message index -> the ids generated) as those ids where the text
     * would stand, the text between them through [encode]: runtime/tokenizer.py's encode_chat with kept (this
     * format inserts an answer's text trimmed and nothing else, so every kept answer splices).
     */
    fun <T> spliced(messages: List<ChatMessage>, kept: Map<Int, List<T>>, encode: (String) -> List<T>): List<T> {
        val out = ArrayList<T>()
        val text = StringBuilder()
        for ((i, m) in messages.withIndex()) {
            text.append("<start_of_turn>").append(if (m.role == "assistant") "model" else m.role).append('\n')
            val ids = kept[i]
            if (ids == null) {
                text.append(m.content.trim())
            } else {
                out += encode(text.toString()).also { text.clear() }
                out += ids
            }
            text.append("<end_of_turn>\n")
        }
        return out + encode(text.append("<start_of_turn>model\n").toString())
    }
}
