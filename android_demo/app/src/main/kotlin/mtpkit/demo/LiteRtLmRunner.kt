package mtpkit.demo

import com.google.ai.edge.litertlm.Backend
import com.google.ai.edge.litertlm.BenchmarkInfo
import com.google.ai.edge.litertlm.Conversation
import com.google.ai.edge.litertlm.ConversationConfig
import com.google.ai.edge.litertlm.Engine
import com.google.ai.edge.litertlm.EngineConfig
import com.google.ai.edge.litertlm.ExperimentalApi
import com.google.ai.edge.litertlm.ExperimentalFlags
import com.google.ai.edge.litertlm.ModelInfo

/**
 * A model.litertlm written by `mtpkit export --backend litert` on LiteRT-LM's own Engine, which runs its own
 * draft-verify loop (core's loop is not used here). One LiteRT-LM Conversation is kept across turns: it holds the
 * history and renders it with the bundle's template. LiteRT-LM reports no acceptance figures, so "is speculation
 * really on?" is answered three ways: the bundle has a drafter section (ModelInfo), the conversation asks for
 * speculative decoding explicitly (never inherited, so it cannot be silently off), and decode tokens/s with the
 * drafter on vs off on the same prompt (the toggle on screen).
 */
@OptIn(ExperimentalApi::class)
class LiteRtLmRunner(private val path: String) : AutoCloseable {
    val hasDrafter: Boolean = ModelInfo.from(path).use { it is ModelInfo.Llm && it.hasSpeculativeDecodingSupport() }
    private val engine: Engine
    private var conversation: Conversation? = null
    private var speculativeAsked = false // what the open conversation was created with

    init {
        ExperimentalFlags.enableBenchmark = true // read when the Engine is created; gives decode tokens/s
        engine = Engine(EngineConfig(modelPath = path, backend = Backend.CPU()))
        engine.initialize()
    }

    /** Whether sending with [speculative] starts a new conversation: the setting is fixed per conversation. */
    fun startsOver(speculative: Boolean) = conversation != null && speculative != speculativeAsked

    /** Sends one user message to the kept conversation; streams the answer's text; returns LiteRT-LM's timing. */
    suspend fun send(text: String, speculative: Boolean, onText: (String) -> Unit): BenchmarkInfo {
        require(!speculative || hasDrafter) { "$path has no drafter section; re-export with mtpkit export --backend litert" }
        if (startsOver(speculative)) reset()
        val c = conversation ?: engine.createConversation(ConversationConfig(enableSpeculativeDecoding = speculative))
            .also { conversation = it; speculativeAsked = speculative }
        val answer = StringBuilder()
        c.sendMessageAsync(text).collect { answer.append(it.toString()); onText(answer.toString()) }
        return c.getBenchmarkInfo()
    }

    /** Forgets the history: the next message opens a new conversation. */
    fun reset() {
        conversation?.close()
        conversation = null
    }

    override fun close() {
        reset()
        engine.close()
    }
}
