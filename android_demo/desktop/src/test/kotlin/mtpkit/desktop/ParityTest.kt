package mtpkit.desktop

import mtpkit.core.Embeddings
import mtpkit.core.Engine
import mtpkit.core.GenConfig
import mtpkit.core.Json
import mtpkit.core.ModelManifest
import mtpkit.core.OnnxPair
import mtpkit.core.Stats
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.DynamicTest
import org.junit.jupiter.api.MethodOrderer
import org.junit.jupiter.api.Order
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.TestFactory
import org.junit.jupiter.api.TestInstance
import org.junit.jupiter.api.TestMethodOrder
import java.io.File
import java.util.concurrent.TimeUnit

/**
 * The Kotlin loop on the exported trained tiny pair produces exactly the token ids (and draft statistics) that
 * `mtpkit run --json` produces, greedy. Needs -Dmtpkit.export, -Dmtpkit.cli (the mtpkit executable) and
 * -Dmtpkit.ortLib (libonnxruntime.so from the onnxruntime wheel); android_demo/test.sh sets all three.
 */
/** One export driven by the Kotlin loop and by `mtpkit run --json`; [exportProperty] names the -D that gives it. */
abstract class ExportParity(exportProperty: String) {
    protected val prompts = listOf("def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    \"\"\"A stack.\"\"\"\n")
    private val maxNewTokens = 48
    protected fun prop(name: String) = System.getProperty(name) ?: error("set -D$name (android_demo/test.sh does)")

    protected val dir = File(prop(exportProperty))
    protected val manifest = ModelManifest.load(dir)
    private val session = OrtGraphSession(manifest, prop("mtpkit.ortLib"), threads = 1)
    protected val accepted = ArrayList<Int>()

    /** What the Python runtime produces: one `mtpkit run --json` process, on one thread like the Kotlin side. */
    private fun python(prompt: String, vararg flags: String): Map<*, *> {
        val cmd = listOf(prop("mtpkit.cli"), "run", dir.path, "--prompt", prompt, "--max-new-tokens", "$maxNewTokens",
            "--threads", "1", "--json", *flags)
        val proc = ProcessBuilder(cmd).redirectError(ProcessBuilder.Redirect.INHERIT).start()
        val out = proc.inputStream.bufferedReader().readText()
        check(proc.waitFor(120, TimeUnit.SECONDS) && proc.exitValue() == 0) { "${cmd.joinToString(" ")} failed" }
        return Json.parse(out) as Map<*, *>
    }

    private fun ints(x: Any?) = (x as List<*>).map { (it as Long).toInt() }

    /** Same greedy tokens and the same per-round accounting as the Python runtime, for one case. */
    protected fun check(prompt: String, cfg: GenConfig, flags: Array<String>) {
        val expected = python(prompt, *flags)
        val pair = OnnxPair(manifest, session) // fresh KV buffers per case, as a fresh Python process has
        val stats = Stats()
        val got = Engine(manifest, pair.target, pair.drafter).generate(ints(expected["prompt_ids"]).toIntArray(), cfg, stats)
        assertEquals(ints(expected["output_ids"]), got.map { it.token }.toList())
        val py = expected["stats"] as Map<*, *>
        assertEquals(listOf(py["target_calls"], py["drafter_calls"], py["drafted"], py["accepted"]),
            listOf(stats.targetCalls, stats.drafterCalls, stats.drafted, stats.accepted).map { it.toLong() })
        assertEquals((py["acceptance_by_position"] as List<*>).map { (it as Number).toDouble() }, stats.acceptanceByPosition)
        accepted.add(stats.accepted)
    }

    protected fun config(k: Int, schedule: String) = GenConfig(maxNewTokens, numAssistantTokens = k, schedule = schedule)
    protected fun plainConfig() = GenConfig(maxNewTokens, mtp = false)
}

/**
 * The Kotlin loop on the exported trained tiny pair produces exactly the token ids (and draft statistics) that
 * `mtpkit run --json` produces, greedy. Needs -Dmtpkit.export, -Dmtpkit.cli (the mtpkit executable) and
 * -Dmtpkit.ortLib (libonnxruntime.so from the onnxruntime wheel); android_demo/test.sh sets all three.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
@TestMethodOrder(MethodOrderer.OrderAnnotation::class)
class ParityTest : ExportParity("mtpkit.export") {
    @TestFactory
    @Order(1)
    fun speculativeMatchesMtpkitRun(): List<DynamicTest> = prompts.indices.flatMap { p ->
        listOf(1, 4).flatMap { k ->
            listOf("constant", "heuristic").map { schedule ->
                DynamicTest.dynamicTest("prompt $p, k=$k, $schedule") {
                    check(prompts[p], config(k, schedule), arrayOf("-k", "$k", "--schedule", schedule))
                }
            }
        }
    }

    @Test
    @Order(2)
    fun plainMatchesMtpkitRunNoMtp() = check(prompts[0], plainConfig(), arrayOf("--no-mtp"))

    /** Parity with a drafter that never helps would prove little: the trained pair must accept drafts. */
    @Test
    @Order(3)
    fun draftsWereAccepted() = assertTrue(accepted.sum() > 0, "no draft was accepted in any parity case")
}

/**
 * The same on an int8 target / int4 drafter export (test.sh derives it from the float one): the Kotlin host lookup
 * dequantizes the int8 embedding blocks exactly as the Python runtime does, or the drafts would differ.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class QuantizedParityTest : ExportParity("mtpkit.exportQuantized") {
    @Test
    fun theExportIsQuantized() = assertEquals("int8", manifest.onnx.embedding.dtype)

    /** Row for row, bit for bit, the Python runtime's host lookup (runtime/backends/onnx.py Embeddings). */
    @Test
    fun hostLookupEqualsThePythonRuntimes() {
        val tokens = listOf(0, 1, 7, 100, manifest.vocabSize - 1)
        val code = "import sys, json; from mtpkit.runtime.manifest import load_manifest; " +
            "from mtpkit.runtime.backends.onnx import Embeddings; m = load_manifest(sys.argv[1]); " +
            "e = Embeddings(m, m.backend('onnx')); print(json.dumps([[float(x) for x in e(int(t)).reshape(-1)] " +
            "for t in sys.argv[2:]]))"
        val python = File(prop("mtpkit.cli")).resolveSibling("python").path
        val proc = ProcessBuilder(listOf(python, "-c", code, dir.path) + tokens.map { "$it" })
            .redirectError(ProcessBuilder.Redirect.INHERIT).start()
        val rows = Json.parse(proc.inputStream.bufferedReader().readText()) as List<*>
        check(proc.waitFor(60, TimeUnit.SECONDS) && proc.exitValue() == 0) { "python lookup failed" }
        val lookup = Embeddings(manifest)
        for ((t, row) in tokens.zip(rows)) {
            val want = (row as List<*>).map { (it as Number).toFloat() }
            assertEquals(want, lookup(t).floats!!.toList(), "token $t")
        }
    }

    @Test
    fun speculativeMatchesMtpkitRun() = check(prompts[0], config(4, "constant"), arrayOf("-k", "4", "--schedule", "constant"))

    @Test
    fun plainMatchesMtpkitRunNoMtp() = check(prompts[1], plainConfig(), arrayOf("--no-mtp"))
}
