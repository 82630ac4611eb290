package mtpkit.demo

import ai.djl.huggingface.tokenizers.HuggingFaceTokenizer
import mtpkit.core.ChatMessage
import mtpkit.core.Conversation
import mtpkit.core.Engine
import mtpkit.core.GenConfig
import mtpkit.core.ModelManifest
import mtpkit.core.OnnxPair
import mtpkit.core.Stats
import java.io.File

/**
 * An mtpkit ONNX export folder driven by core's loop as a chat: one KV cache and one core Conversation for the
 * whole history, so each turn prefills only what is new. The tokenizer (DJL over HF tokenizers) is app-side.
 */
class OnnxRunner(dir: File, threads: Int = Runtime.getRuntime().availableProcessors()) : AutoCloseable {
    // checks schema_version and every file's sha256, the template's too; then that the app can render the template
    val manifest = ModelManifest.load(dir)
    private val format = ChatTurns.check(manifest)
    private val session = OrtAndroidSession(manifest, threads)
    // what DJL's newInstance(Path) does for a file; java.nio.file.Path is API 26 and test.sh compiles against 23
    private val tokenizer = manifest.path(manifest.tokenizerFile).inputStream()
        .use { HuggingFaceTokenizer.newInstance(it, null) }
    private val pair = OnnxPair(manifest, session) // the conversation's KV buffers, kept across turns
    // the oldest whole turns go when the history outgrows the export's KV capacity
    val conversation = Conversation(Engine(manifest, pair.target, pair.drafter), ::encodeChat, ::decode, dropOldest = true)

    /** Ids of the history in the chat template, kept answers as their ids, as runtime/tokenizer.py encode_chat
     *  gives them (bos first). */
    fun encodeChat(messages: List<ChatMessage>, kept: Map<Int, List<Int>>): IntArray {
        val ids = ChatTurns.spliced(messages, kept, format) { text -> tokenizer.encode(text, false, false).ids.map { it.toInt() } }
        return (listOfNotNull(manifest.bos) + ids).toIntArray()
    }

    fun decode(ids: List<Int>): String = tokenizer.decode(LongArray(ids.size) { ids[it].toLong() }, true)

    /** Sends one user message; streams the answer's text so far after every token; [stats] is live. */
    fun send(text: String, cfg: GenConfig, stats: Stats, onText: (String) -> Unit) {
        for (emitted in conversation.send(text, cfg, stats)) onText(conversation.messages.last().content)
    }

    /** Forgets the history; the next turn prefills from the first position. */
    fun reset() = conversation.reset()

    override fun close() {
        session.close()
        tokenizer.close()
    }
}
