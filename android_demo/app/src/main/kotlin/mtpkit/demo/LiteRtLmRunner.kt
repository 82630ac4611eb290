package mtpkit.demo

import com.google.ai.edge.litertlm.Backend
import com.google.ai.edge.litertlm.BenchmarkInfo
import com.google.ai.edge.litertlm.ConversationConfig
import com.google.ai.edge.litertlm.Engine
import com.google.ai.edge.litertlm.EngineConfig
import com.google.ai.edge.litertlm.ExperimentalApi
import com.google.ai.edge.litertlm.ExperimentalFlags
import com.google.ai.edge.litertlm.ModelInfo

/**
 * A model.litertlm written by `mtpkit export --backend litert` on LiteRT-LM's own Engine, which runs its own
 * draft-verify loop (core's loop is not used here). LiteRT-LM reports no acceptance figures, so "is speculation
 * really on?" is answered three ways: the bundle has a drafter section (ModelInfo), the conversation asks for
 * speculative decoding explicitly (never inherited, so it cannot be silently off), and decode tokens/s with the
 * drafter on vs off on the same prompt (the toggle on screen).
 */
@OptIn(ExperimentalApi::class)
class LiteRtLmRunner(private val path: String) : AutoCloseable {
    val hasDrafter: Boolean = ModelInfo.from(path).use { it is ModelInfo.Llm && it.hasSpeculativeDecodingSupport() }
    private val engine: Engine

    init {
        ExperimentalFlags.enableBenchmark = true // read when the Engine is created; gives decode tokens/s
        engine = Engine(EngineConfig(modelPath = path, backend = Backend.CPU()))
        engine.initialize()
    }

    /** Streams text; returns LiteRT-LM's own timing of this turn. */
    suspend fun generate(prompt: String, speculative: Boolean, onText: (String) -> Unit): BenchmarkInfo {
        require(!speculative || hasDrafter) { "$path has no drafter section; re-export with mtpkit export --backend litert" }
        engine.createConversation(ConversationConfig(enableSpeculativeDecoding = speculative)).use { conversation ->
            val text = StringBuilder()
            conversation.sendMessageAsync(prompt).collect { text.append(it.toString()); onText(text.toString()) }
            return conversation.getBenchmarkInfo()
        }
    }

    override fun close() = engine.close()
}
