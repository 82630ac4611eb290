package mtpkit.core

import java.io.RandomAccessFile
import java.nio.ByteOrder
import java.nio.FloatBuffer
import java.nio.channels.FileChannel

/**
 * The target's scaled token embedding, looked up on the host in the table the target graph also uses
 * (embeddings.bin, ONNX external data), so the 262k-row table is stored once. Memory-mapped, never read whole.
 */
class Embeddings(manifest: ModelManifest) {
    private val spec = manifest.onnx.embedding
    private val table: FloatBuffer

    init {
        RandomAccessFile(manifest.path(spec.file), "r").use { f ->
            val bytes = spec.rows.toLong() * spec.cols * 4
            table = f.channel.map(FileChannel.MapMode.READ_ONLY, spec.offset, bytes)
                .order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer()
        }
    }

    /** E[token] * scale as [1, 1, H]: the drafter's inputs_embeds (float32 product, as numpy computes it). */
    operator fun invoke(token: Int): Tensor {
        require(token in 0 until spec.rows) { "token id $token is outside the embedding table (${spec.rows} rows)" }
        val row = FloatArray(spec.cols) { table.get(token * spec.cols + it) * spec.scale }
        return Tensor.of(longArrayOf(1, 1, spec.cols.toLong()), row)
    }
}
