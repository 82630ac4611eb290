package mtpkit.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.io.TempDir
import java.io.File
import java.nio.file.Files

/** The real export of the trained tiny pair, made by test.sh (`mtpkit export`) and passed as -Dmtpkit.export. */
fun exportDir(): File {
    val path = System.getProperty("mtpkit.export") ?: error("set -Dmtpkit.export=DIR (android_demo/test.sh does)")
    return File(path).also { check(File(it, MANIFEST_NAME).isFile) { "$it has no $MANIFEST_NAME; run android_demo/test.sh" } }
}

class ManifestTest {
    @TempDir
    lateinit var tmp: File

    /** A copy of the export whose manifest.json text went through [edit]; graph files are symlinked, not copied. */
    private fun editedExport(edit: (String) -> String): File {
        val src = exportDir()
        for (f in src.listFiles()!!) if (f.name != MANIFEST_NAME) Files.createSymbolicLink(File(tmp, f.name).toPath(), f.toPath())
        File(tmp, MANIFEST_NAME).writeText(edit(File(src, MANIFEST_NAME).readText()))
        return tmp
    }

    private fun refusal(dir: File): String = assertThrows(ManifestError::class.java) { ModelManifest.load(dir) }.message!!

    @Test
    fun readsTheRealExport() {
        val m = ModelManifest.load(exportDir())
        assertEquals(256, m.capacity)
        assertEquals(setOf(1, 6), m.eosIds)
        assertEquals(Triple(2, true, "tokenizer.json"), Triple(m.bos, m.addBos, m.tokenizerFile))
        assertEquals(listOf("sliding_attention", "full_attention"), m.kvLayers.map { it.type }.distinct())
        assertEquals(mapOf("sliding_attention" to 3, "full_attention" to 4), m.drafterLayers)
        assertEquals(m.drafterSlidingVisible, m.slidingPast + 2) // W-1 for the target, W+1 for the drafter
        assertEquals(setOf("prefill", "decode", "verify", "draft"), m.onnx.signatures.keys)
        assertEquals(m.vocabSize to m.hiddenSize, m.onnx.embedding.rows to m.onnx.embedding.cols)
        val verify = m.onnx.signatures.getValue("verify")
        for (layer in m.kvLayers.map { it.layer }) {
            for (role in listOf("past_key", "past_value")) assertTrue(verify.inputs.any { it.key == RoleKey(role, layer) })
            for (role in listOf("new_key", "new_value")) assertTrue(verify.outputs.any { it.key == RoleKey(role, layer) })
        }
        val stores = m.onnx.signatures.getValue("draft").inputs.filter { it.role == "store_key" }
        assertEquals(m.drafterLayers, stores.associate { it.layerType to it.layer })
    }

    @Test
    fun refusesAnotherSchemaVersion() {
        val message = refusal(editedExport { it.replaceFirst("\"schema_version\": 3", "\"schema_version\": 2") })
        assertTrue("schema_version 2" in message && "re-export" in message, message)
    }

    @Test
    fun refusesAManifestWithoutKvCache() {
        val data = Json.parse(File(exportDir(), MANIFEST_NAME).readText()) as Map<*, *>
        val e = assertThrows(ManifestError::class.java) { ModelManifest.parse(data - "kv_cache", exportDir()) }
        assertTrue("malformed" in e.message!! && "kv_cache" in e.message!!, e.message)
    }

    @Test
    fun refusesAnUnknownRole() {
        val message = refusal(editedExport { it.replaceFirst("\"role\": \"new_key\"", "\"role\": \"present_key\"") })
        assertTrue("present_key" in message, message)
    }

    @Test
    fun refusesAModifiedGraph() {
        val digest = ModelManifest.sha256(File(exportDir(), "drafter.onnx"))
        val message = refusal(editedExport { it.replace(digest, "0".repeat(64)) })
        assertTrue("drafter.onnx does not match the sha256" in message, message)
    }

    @Test
    fun refusesAModifiedTokenizer() {
        val digest = ModelManifest.sha256(File(exportDir(), "tokenizer.json"))
        assertEquals(digest, ModelManifest.load(exportDir()).tokenizerSha256)
        val message = refusal(editedExport { it.replace(digest, "0".repeat(64)) })
        assertTrue("tokenizer.json does not match the sha256" in message, message)
    }

    @Test
    fun refusesAManifestWithoutTheTokenizersSha256() {
        val data = Json.parse(File(exportDir(), MANIFEST_NAME).readText()) as Map<*, *>
        val tokenizer = (data["tokenizer"] as Map<*, *>) - "sha256"
        val e = assertThrows(ManifestError::class.java) { ModelManifest.parse(data + ("tokenizer" to tokenizer), exportDir()) }
        assertTrue("malformed" in e.message!! && "sha256" in e.message!!, e.message)
    }

    @Test
    fun refusesTextThatIsNotJson() {
        val message = refusal(editedExport { it.dropLast(3) })
        assertTrue("not valid JSON" in message, message)
        assertTrue("has no manifest.json" in refusal(File(tmp, "missing").also { it.mkdirs() }))
    }
}
