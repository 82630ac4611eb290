package mtpkit.core

import java.io.File
import java.security.MessageDigest

/** The manifest.json schema this code reads; mirrors SCHEMA_VERSION in runtime/manifest.py. */
const val SCHEMA_VERSION = 3
const val MANIFEST_NAME = "manifest.json"

/** Mirrors runtime/roles.py ROLES: a tensor tagged with any other role is refused, as the Python runtime does. */
val ROLES = setOf(
    "input_ids", "input_pos", "embeddings", "per_layer_embeddings", "token_ids", "mask", "logits", "activations",
    "past_key", "past_value", "new_key", "new_value", "kv_key", "kv_value",
    "inputs_embeds", "embeds_and_activations", "store_key", "store_value", "projected_activations",
    "selected_logits", "selected_ids",
)

/** A manifest or export folder that cannot be used; the message says what to do. */
class ManifestError(message: String) : IllegalArgumentException(message)

/** How runtimes address a tensor: its role plus the layer index, or the layer type for per-type tensors. */
data class RoleKey(val role: String, val layer: Int? = null, val layerType: String? = null)

data class TensorSpec(val name: String, val role: String, val dtype: String, val layer: Int?, val layerType: String?) {
    /** Same rule as TensorSpec.key in runtime/manifest.py: the layer when set, else the layer type. */
    val key: RoleKey get() = RoleKey(role, layer, if (layer == null) layerType else null)
}

data class Signature(val graph: String, val inputs: List<TensorSpec>, val outputs: List<TensorSpec>)

data class GraphFile(val file: String, val sha256: String, val dataFiles: Map<String, String>)

data class KvLayer(val layer: Int, val type: String, val kvHeads: Int, val headDim: Int)

/**
 * The host embedding table the ONNX target graph also uses (backends.onnx.options.embedding): float32 or float16
 * rows at [offset], or, for int8 / int4 exports, the blockwise codes and scales the graph's GatherBlockQuantized
 * reads ([blocks]).
 */
data class EmbeddingTable(val file: String, val offset: Long, val rows: Int, val cols: Int, val scale: Float,
                          val dtype: String = "float32", val blocks: QuantBlocks? = null)

/** MatMulNBits layout: codes uint8 [rows, nBlocks, blockSize * bits / 8] (int4: low nibble first), then scales
 *  [rows, nBlocks]; value = (code - zeroPoint) * scale. */
data class QuantBlocks(val bits: Int, val blockSize: Int, val nBlocks: Int, val zeroPoint: Int, val dataOffset: Long,
                       val scalesOffset: Long, val scalesDtype: String)

data class OnnxBackend(
    val graphs: Map<String, GraphFile>,
    val signatures: Map<String, Signature>,
    val embedding: EmbeddingTable,
)

/** What the Kotlin loop needs from manifest.json (schema_version 3); everything is bound by role, never by name. */
data class ModelManifest(
    val root: File,
    val vocabSize: Int,
    val hiddenSize: Int,
    val eosIds: Set<Int>,
    val numAssistantTokens: Int,
    val schedule: String,
    val capacity: Int,
    val kvLayers: List<KvLayer>,
    val drafterLayers: Map<String, Int>,
    val slidingPast: Int,
    val drafterSlidingVisible: Int,
    val onnx: OnnxBackend,
    val tokenizerSha256: String, // checked by verifyFiles, like the graphs: the app reads the file
    val tokenizerFile: String = "tokenizer.json", // what an app's tokenizer loads (core does not tokenize)
    val bos: Int? = null,
    val addBos: Boolean = true, // prepend bos to a plain (non-chat) prompt, as runtime/tokenizer.py does
    val chatTemplateFile: String? = null, // the export's chat template (Jinja), when its checkpoint had one
    val chatTemplateSha256: String? = null,
) {
    fun path(name: String): File = File(root, name)

    companion object {
        /**
         * Reads DIR/manifest.json; with [verify], checks every graph and data file against its sha256.
         * @throws ManifestError on a missing or malformed manifest, another schema_version, an unknown role,
         *   no onnx backend, or a missing or modified graph file.
         */
        fun load(folder: File, verify: Boolean = true): ModelManifest {
            val file = File(folder, MANIFEST_NAME)
            if (!file.isFile) throw ManifestError("$folder has no $MANIFEST_NAME; pass the DIR written by 'mtpkit export'")
            val data = try {
                Json.parse(file.readText())
            } catch (e: IllegalArgumentException) {
                throw ManifestError("$file is not valid JSON (${e.message}); re-export the model")
            }
            val manifest = parse(data as? Map<*, *> ?: throw ManifestError("$file is not a JSON object; re-export the model"), folder)
            if (verify) verifyFiles(manifest)
            return manifest
        }

        /** Builds a manifest from parsed JSON; refuses any schema_version but [SCHEMA_VERSION]. */
        fun parse(d: Map<*, *>, root: File): ModelManifest {
            val version = d["schema_version"]
            if (version != SCHEMA_VERSION.toLong()) {
                val madeBy = d["mtpkit_version"]?.let { " (written by mtpkit $it)" } ?: ""
                throw ManifestError("manifest schema_version $version$madeBy is not supported: this app reads version " +
                    "$SCHEMA_VERSION; re-export the model with a matching mtpkit (`mtpkit export ...`)")
            }
            return try {
                build(Fields(d), root)
            } catch (e: MissingField) {
                throw ManifestError("manifest.json in $root is malformed (${e.message}); re-export the model")
            }
        }

        private fun build(d: Fields, root: File): ModelManifest {
            val model = d.obj("model")
            val kv = d.obj("kv_cache")
            val generation = d.obj("generation")
            return ModelManifest(
                root = root,
                vocabSize = model.int("vocab_size"),
                hiddenSize = model.int("hidden_size"),
                eosIds = d.obj("tokens").list("eos").map { (it as Number).toInt() }.toSet(),
                numAssistantTokens = generation.int("num_assistant_tokens"),
                schedule = generation.optString("num_assistant_tokens_schedule") ?: "constant",
                capacity = kv.int("capacity"),
                kvLayers = kv.list("layers").map { Fields(it as Map<*, *>).kvLayer() },
                drafterLayers = kv.obj("drafter_layers").map.entries.associate { (k, v) -> k as String to (v as Number).toInt() },
                slidingPast = kv.int("sliding_past"),
                drafterSlidingVisible = kv.int("drafter_sliding_visible"),
                onnx = onnxBackend(d.obj("backends"), root),
                tokenizerFile = d.obj("tokenizer").string("file"),
                tokenizerSha256 = d.obj("tokenizer").string("sha256"),
                bos = d.obj("tokens").optInt("bos"),
                addBos = d.obj("tokenizer").map["add_bos"] as? Boolean ?: true,
                chatTemplateFile = d.obj("tokenizer").optString("chat_template_file"),
                chatTemplateSha256 = d.obj("tokenizer").optString("chat_template_sha256"),
            )
        }

        private fun onnxBackend(backends: Fields, root: File): OnnxBackend {
            if (backends.map["onnx"] == null) {
                throw ManifestError("the export in $root has no onnx graphs (it has: ${backends.map.keys.joinToString()}); " +
                    "re-export with --backend onnx")
            }
            val b = backends.obj("onnx")
            return OnnxBackend(
                graphs = b.obj("graphs").map.entries.associate { (name, g) -> name as String to Fields(g as Map<*, *>).graphFile() },
                signatures = b.obj("signatures").map.entries.associate { (name, s) -> name as String to Fields(s as Map<*, *>).signature() },
                embedding = b.obj("options").obj("embedding").embeddingTable(),
            )
        }

        /** Mirrors verify_files in runtime/manifest.py: a modified export is refused before it runs. Checks every
         *  file the app reads: the ONNX graphs and their data files, the tokenizer and the chat template. */
        fun verifyFiles(m: ModelManifest) {
            for ((name, g) in m.onnx.graphs) {
                for ((file, digest) in mapOf(g.file to g.sha256) + g.dataFiles) verifyFile(m, "onnx $name graph file", file, digest)
            }
            verifyFile(m, "tokenizer file", m.tokenizerFile, m.tokenizerSha256)
            if (m.chatTemplateFile != null && m.chatTemplateSha256 != null) {
                verifyFile(m, "chat template", m.chatTemplateFile, m.chatTemplateSha256)
            }
        }

        private fun verifyFile(m: ModelManifest, what: String, file: String, digest: String) {
            val f = m.path(file)
            if (!f.isFile) throw ManifestError("$what $f is missing; re-export the model")
            if (sha256(f) != digest) {
                throw ManifestError("$f does not match the sha256 in manifest.json (modified or corrupt); re-export the model")
            }
        }

        fun sha256(file: File): String {
            val md = MessageDigest.getInstance("SHA-256")
            file.inputStream().use { s ->
                val buf = ByteArray(1 shl 20)
                while (true) {
                    val n = s.read(buf)
                    if (n < 0) break
                    md.update(buf, 0, n)
                }
            }
            return md.digest().joinToString("") { "%02x".format(it) }
        }
    }
}

private class MissingField(message: String) : Exception(message)

/** Typed access to one JSON object; a missing or mistyped field becomes MissingField (reported as malformed). */
private class Fields(val map: Map<*, *>) {
    private fun get(key: String): Any = map[key] ?: throw MissingField("missing field '$key'")
    fun obj(key: String) = Fields(get(key) as? Map<*, *> ?: throw MissingField("'$key' is not an object"))
    fun list(key: String) = get(key) as? List<*> ?: throw MissingField("'$key' is not a list")
    fun string(key: String) = get(key) as? String ?: throw MissingField("'$key' is not a string")
    fun int(key: String) = (get(key) as? Long ?: throw MissingField("'$key' is not an integer")).toInt()
    fun double(key: String) = (get(key) as? Number ?: throw MissingField("'$key' is not a number")).toDouble()
    fun optString(key: String) = map[key] as? String
    fun optLong(key: String) = (map[key] as? Number)?.toLong()
    fun optInt(key: String) = (map[key] as? Number)?.toInt()

    fun embeddingTable(): EmbeddingTable {
        val dtype = string("dtype")
        val shape = list("shape").map { (it as Number).toInt() }
        val blocks = when (dtype) {
            "float32", "float16" -> null
            "int8", "int4" -> obj("scales").let { s ->
                val scalesDtype = s.string("dtype")
                if (scalesDtype !in setOf("float32", "float16")) throw ManifestError("embedding scales dtype $scalesDtype is not supported")
                QuantBlocks(int("bits"), int("block_size"), obj("data").list("shape").let { (it[1] as Number).toInt() },
                    int("zero_point"), obj("data").optLong("offset") ?: 0L, s.optLong("offset") ?: 0L, scalesDtype)
            }
            else -> throw ManifestError("embedding table dtype $dtype is not supported by this app (float32, float16, " +
                "int8, int4); update the app or re-export the model")
        }
        return EmbeddingTable(string("file"), optLong("offset") ?: 0L, shape[0], shape[1], double("scale").toFloat(), dtype, blocks)
    }

    fun kvLayer() = KvLayer(int("layer"), string("type"), int("kv_heads"), int("head_dim"))

    fun graphFile() = GraphFile(string("file"), string("sha256"),
        (map["data_files"] as? Map<*, *>)?.entries?.associate { (k, v) -> k as String to v as String } ?: emptyMap())

    fun signature() = Signature(string("graph"), list("inputs").map { Fields(it as Map<*, *>).tensor() },
        list("outputs").map { Fields(it as Map<*, *>).tensor() })

    fun tensor(): TensorSpec {
        val role = string("role")
        if (role !in ROLES) {
            throw ManifestError("tensor '${string("name")}' has role '$role', which this app does not know " +
                "(an export from a newer mtpkit?); update the app or re-export with a matching mtpkit")
        }
        return TensorSpec(string("name"), role, string("dtype"), optInt("layer"), optString("layer_type"))
    }
}
