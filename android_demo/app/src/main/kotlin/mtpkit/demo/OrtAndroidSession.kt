package mtpkit.demo

import ai.onnxruntime.OnnxTensor
import ai.onnxruntime.OrtEnvironment
import ai.onnxruntime.OrtSession
import mtpkit.core.GraphSession
import mtpkit.core.ModelManifest
import mtpkit.core.Tensor
import java.nio.FloatBuffer
import java.nio.LongBuffer

/**
 * core's GraphSession over ONNX Runtime Android (ai.onnxruntime): the app's only ONNX-specific code.
 * Options as runtime/backends/onnx.py: sequential, one inter-op thread, full optimisation, no spinning
 * (target and drafter sessions alternate, and a spinning idle session steals the busy one's cores).
 */
class OrtAndroidSession(manifest: ModelManifest, threads: Int) : GraphSession, AutoCloseable {
    private val env = OrtEnvironment.getEnvironment()
    private val sessions: Map<String, OrtSession> = manifest.onnx.graphs.mapValues { (_, graph) ->
        val options = OrtSession.SessionOptions().apply {
            setIntraOpNumThreads(threads)
            setInterOpNumThreads(1)
            setExecutionMode(OrtSession.SessionOptions.ExecutionMode.SEQUENTIAL)
            setOptimizationLevel(OrtSession.SessionOptions.OptLevel.ALL_OPT)
            addConfigEntry("session.intra_op.allow_spinning", "0")
        }
        env.createSession(manifest.path(graph.file).path, options)
    }

    override fun run(graph: String, inputs: Map<String, Tensor>, outputs: List<String>): List<Tensor> {
        val values = inputs.mapValues { (_, t) ->
            if (t.floats != null) OnnxTensor.createTensor(env, FloatBuffer.wrap(t.floats), t.shape)
            else OnnxTensor.createTensor(env, LongBuffer.wrap(t.longs), t.shape)
        }
        try {
            sessions.getValue(graph).run(values, outputs.toSet()).use { result ->
                // by name through the entries: Result.get(name) returns java.util.Optional, API 24 (test.sh uses 23)
                val byName = result.associate { it.key to it.value }
                return outputs.map { name ->
                    val value = byName.getValue(name) as OnnxTensor
                    val data = value.floatBuffer // a copy; every output of the exported graphs is float32
                    Tensor.of(value.info.shape, FloatArray(data.remaining()).also { data.get(it) })
                }
            }
        } finally {
            values.values.forEach { it.close() }
        }
    }

    override fun close() = sessions.values.forEach { it.close() }
}
