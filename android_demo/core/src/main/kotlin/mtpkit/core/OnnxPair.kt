package mtpkit.core

/**
 * Target and drafter over an exported ONNX pair (mirrors runtime/backends/onnx.py): feeds and outputs are bound
 * by role from the manifest, never by tensor name, so a platform adapter only has to run graphs by name.
 */
class OnnxPair(val manifest: ModelManifest, session: GraphSession) {
    val kv = WindowKv(manifest)
    val target = WindowTarget(manifest, session, kv)
    val drafter = WindowDrafter(manifest, session, Embeddings(manifest))
}

/** Runs one signature with feeds keyed by role; returns outputs keyed by role. */
internal fun runByRole(session: GraphSession, sig: Signature, feeds: Map<RoleKey, Tensor>): Map<RoleKey, Tensor> {
    val named = sig.inputs.associate { t ->
        t.name to (feeds[t.key] ?: throw ManifestError("no value bound for input ${t.name} (${t.key})"))
    }
    val values = session.run(sig.graph, named, sig.outputs.map { it.name })
    return sig.outputs.map { it.key }.zip(values).toMap()
}

internal fun scalar(value: Int) = Tensor.ofLongs(longArrayOf(1), longArrayOf(value.toLong()))

class WindowTarget(manifest: ModelManifest, private val session: GraphSession, private val kv: WindowKv) : Target {
    private val signatures = manifest.onnx.signatures
    override var calls = 0
        private set

    override fun forward(ids: IntArray, pos: Int): TargetOutput {
        kv.checkRoom(pos, ids.size)
        val name = if (ids.size == 1) "decode" else if (pos > 0) "verify" else "prefill"
        val feeds = HashMap<RoleKey, Tensor>()
        feeds[RoleKey("input_ids")] = Tensor.ofLongs(longArrayOf(1, ids.size.toLong()), LongArray(ids.size) { ids[it].toLong() })
        feeds[RoleKey("input_pos")] = scalar(pos)
        for (layer in kv.layerIndices) {
            val (k, v) = kv.past(layer, pos)
            feeds[RoleKey("past_key", layer)] = k
            feeds[RoleKey("past_value", layer)] = v
        }
        val out = runByRole(session, signatures.getValue(name), feeds)
        for (layer in kv.layerIndices) {
            kv.write(layer, pos, out.getValue(RoleKey("new_key", layer)), out.getValue(RoleKey("new_value", layer)))
        }
        calls++
        val logits = out.getValue(RoleKey("logits"))
        val activations = out.getValue(RoleKey("activations"))
        return TargetOutput(ids.indices.map { logits.row(it) }, ids.indices.map { activations.row(it) })
    }

    override fun drafterView(pos: Int): DrafterView = kv.drafterView(pos)

    override fun keepFrom(pos: Int) = kv.keepFrom(pos)

    override fun resumable(pos: Int): Boolean = kv.resumable(pos)
}

class WindowDrafter(manifest: ModelManifest, private val session: GraphSession, private val embed: Embeddings) : Drafter {
    private val signature = manifest.onnx.signatures.getValue("draft")
    private val storeInputs = signature.inputs.filter { it.role == "store_key" || it.role == "store_value" }
    override var calls = 0
        private set

    override fun step(token: Int, activations: FloatArray, pos: Int, view: DrafterView): DraftOutput {
        val feeds = HashMap<RoleKey, Tensor>()
        feeds[RoleKey("inputs_embeds")] = embed(token)
        feeds[RoleKey("activations")] = Tensor.of(longArrayOf(1, 1, activations.size.toLong()), activations)
        feeds[RoleKey("input_pos")] = scalar(pos)
        for (t in storeInputs) {
            val (k, v) = view[t.layerType] ?: throw ManifestError("draft input ${t.name} has no layer_type; re-export the model")
            feeds[t.key] = if (t.role == "store_key") k else v
        }
        val out = runByRole(session, signature, feeds)
        calls++
        return DraftOutput(out.getValue(RoleKey("logits")).row(0), out.getValue(RoleKey("projected_activations")).row(0))
    }
}
