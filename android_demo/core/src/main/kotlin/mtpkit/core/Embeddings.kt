package mtpkit.core

import java.io.RandomAccessFile
import java.nio.ByteBuffer
import java.nio.ByteOrder
import java.nio.channels.FileChannel

/**
 * The target's scaled token embedding, looked up on the host in the table the target graph also uses
 * (embeddings.bin, ONNX external data), so the 262k-row table is stored once: float32 / float16 rows, or the int8 /
 * int4 blocks of a quantized export, dequantized per row exactly as runtime/embedding_table.py does (float32
 * arithmetic, same order). Memory-mapped, never read whole.
 */
class Embeddings(manifest: ModelManifest) {
    private val spec = manifest.onnx.embedding
    private val file: ByteBuffer = RandomAccessFile(manifest.path(spec.file), "r").use { f ->
        f.channel.map(FileChannel.MapMode.READ_ONLY, 0, f.length()).order(ByteOrder.LITTLE_ENDIAN)
    }

    /** E[token] * scale as [1, 1, H]: the drafter's inputs_embeds (float32 product, as numpy computes it). */
    operator fun invoke(token: Int): Tensor {
        require(token in 0 until spec.rows) { "token id $token is outside the embedding table (${spec.rows} rows)" }
        val row = row(token)
        for (i in row.indices) row[i] = row[i] * spec.scale
        return Tensor.of(longArrayOf(1, 1, spec.cols.toLong()), row)
    }

    private fun row(token: Int): FloatArray {
        val q = spec.blocks
        return when {
            q != null -> quantizedRow(token, q)
            spec.dtype == "float16" -> FloatArray(spec.cols) { halfToFloat(file.getShort((spec.offset + 2L * (token.toLong() * spec.cols + it)).toInt())) }
            else -> FloatArray(spec.cols) { file.getFloat((spec.offset + 4L * (token.toLong() * spec.cols + it)).toInt()) }
        }
    }

    private fun quantizedRow(token: Int, q: QuantBlocks): FloatArray {
        val blob = q.blockSize * q.bits / 8
        val codes = (q.dataOffset + token.toLong() * q.nBlocks * blob).toInt()
        val scaleBytes = if (q.scalesDtype == "float16") 2 else 4
        return FloatArray(spec.cols) { i ->
            val block = i / q.blockSize
            val at = (q.scalesOffset + scaleBytes.toLong() * (token.toLong() * q.nBlocks + block)).toInt()
            val scale = if (scaleBytes == 2) halfToFloat(file.getShort(at)) else file.getFloat(at)
            val byte = file.get(codes + block * blob + (i % q.blockSize) * q.bits / 8).toInt() and 0xFF
            val code = if (q.bits == 8) byte else if (i % 2 == 0) byte and 0x0F else byte ushr 4
            (code - q.zeroPoint).toFloat() * scale
        }
    }

    companion object {
        /** IEEE 754 half -> float (exact; JDK 17 has no Float.float16ToFloat). */
        fun halfToFloat(h: Short): Float {
            val bits = h.toInt() and 0xFFFF
            val sign = (bits and 0x8000) shl 16
            val exp = (bits ushr 10) and 0x1F
            val mant = bits and 0x3FF
            return when (exp) {
                0 -> (if (sign != 0) -1f else 1f) * mant * 5.9604645e-8f // subnormal: mant * 2^-24
                0x1F -> Float.fromBits(sign or 0x7F800000 or (mant shl 13))
                else -> Float.fromBits(sign or ((exp + 112) shl 23) or (mant shl 13))
            }
        }
    }
}
