package mtpkit.desktop

import com.sun.jna.Memory
import com.sun.jna.Pointer
import mtpkit.core.GraphSession
import mtpkit.core.ModelManifest
import mtpkit.core.Tensor

/**
 * core's GraphSession over ONNX Runtime's C API (JNA): one ORT session per graph file of the manifest's onnx
 * backend. Test-only: on Android the same interface is implemented with ai.onnxruntime (app/).
 */
class OrtGraphSession(manifest: ModelManifest, libraryPath: String, threads: Int = 1) : GraphSession {
    private val ort = OrtApi(libraryPath)
    private val env = ort.createEnv()
    private val memoryInfo = ort.createCpuMemoryInfo()
    private val sessions: Map<String, Pointer>

    init {
        val options = ort.createSessionOptions(threads)
        sessions = manifest.onnx.graphs.mapValues { (_, g) -> ort.createSession(env, manifest.path(g.file).path, options) }
    }

    override fun run(graph: String, inputs: Map<String, Tensor>, outputs: List<String>): List<Tensor> {
        val session = sessions[graph] ?: error("no ONNX graph '$graph' in the manifest")
        // ORT reads the input bytes in place, so they must outlive Run: a local list that is never read again is
        // dead to the JIT and JNA's cleaner frees it mid-Run (seen as wrong tokens under GC pressure, and a SIGSEGV
        // in CI). Closing them in `finally` both keeps them alive and frees them at a known point.
        val buffers = ArrayList<Memory>()
        val values = ArrayList<Pointer>()
        try {
            for (t in inputs.values) toOrt(t, buffers).also { values.add(it) }
            val results = ort.run(session, inputs.keys.toTypedArray(), values.toTypedArray(), outputs.toTypedArray())
            return results.map { v -> try { fromOrt(v) } finally { ort.releaseValue(v) } }
        } finally {
            values.forEach { ort.releaseValue(it) }
            buffers.forEach { it.close() }
        }
    }

    private fun toOrt(t: Tensor, buffers: MutableList<Memory>): Pointer {
        val (bytes, type) = if (t.floats != null) t.floats!!.size * 4L to 1 /* FLOAT */ else t.longs!!.size * 8L to 7 /* INT64 */
        val data = Memory(maxOf(1L, bytes)).also { buffers.add(it) } // JNA refuses 0-byte blocks; an empty window still needs one
        if (t.floats != null) data.write(0, t.floats!!, 0, t.floats!!.size) else data.write(0, t.longs!!, 0, t.longs!!.size)
        return ort.createTensor(memoryInfo, data, bytes, t.shape, type)
    }

    /** Every output of the exported graphs is float32 (logits, activations, K/V). */
    private fun fromOrt(value: Pointer): Tensor {
        val shape = ort.shape(value)
        val size = shape.fold(1L) { a, b -> a * b }.toInt()
        return Tensor.of(shape, ort.data(value).getFloatArray(0, size))
    }
}
