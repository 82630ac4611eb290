package mtpkit.demo

import ai.djl.huggingface.tokenizers.HuggingFaceTokenizer
import mtpkit.core.Engine
import mtpkit.core.GenConfig
import mtpkit.core.ModelManifest
import mtpkit.core.OnnxPair
import mtpkit.core.Stats
import java.io.File

/** An mtpkit ONNX export folder driven by core's loop; the tokenizer (DJL over HF tokenizers) is app-side. */
class OnnxRunner(dir: File, threads: Int = Runtime.getRuntime().availableProcessors()) : AutoCloseable {
    val manifest = ModelManifest.load(dir) // checks schema_version and every graph's sha256
    private val session = OrtAndroidSession(manifest, threads)
    // what DJL's newInstance(Path) does for a file; java.nio.file.Path is API 26 and test.sh compiles against 23
    private val tokenizer = manifest.path(manifest.tokenizerFile).inputStream()
        .use { HuggingFaceTokenizer.newInstance(it, null) }

    /** Ids as runtime/tokenizer.py encodes a plain prompt: no special tokens, then bos prepended. */
    fun encode(text: String): IntArray {
        val ids = tokenizer.encode(text, false, false).ids.map { it.toInt() }
        val bos = manifest.bos
        return (if (manifest.addBos && bos != null && ids.firstOrNull() != bos) listOf(bos) + ids else ids).toIntArray()
    }

    /** Streams the decoded text so far after every token; [stats] is live (calls, acceptance, timings). */
    fun generate(prompt: String, cfg: GenConfig, stats: Stats, onText: (String) -> Unit) {
        val pair = OnnxPair(manifest, session) // fresh KV buffers per request
        val out = ArrayList<Long>()
        for (emitted in Engine(manifest, pair.target, pair.drafter).generate(encode(prompt), cfg, stats)) {
            out.add(emitted.token.toLong())
            onText(tokenizer.decode(out.toLongArray(), true))
        }
    }

    override fun close() {
        session.close()
        tokenizer.close()
    }
}
