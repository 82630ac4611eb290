package mtpkit.core

/**
 * The host's KV buffers for window KV I/O (mirrors WindowKV in runtime/backends/onnx.py).
 *
 * One preallocated [1, kv_heads, capacity, head_dim] buffer per KV-owning target layer. A target call at `pos`
 * writes its new entries at pos..pos+T-1. Rollback after a rejected draft is only a rewind of the caller's
 * `pos`: masks come from absolute positions, so slots beyond it are never read until they are overwritten.
 */
class WindowKv(private val manifest: ModelManifest) {
    val capacity = manifest.capacity
    private val layers = manifest.kvLayers.associateBy { it.layer }
    private val keys = layers.mapValues { (_, d) -> FloatArray(d.kvHeads * capacity * d.headDim) }
    private val values = layers.mapValues { (_, d) -> FloatArray(d.kvHeads * capacity * d.headDim) }

    val layerIndices: List<Int> get() = layers.keys.toList()

    /** The past window a target call at [pos] reads: full layers all of it, sliding layers the last W-1. */
    fun past(layer: Int, pos: Int): Pair<Tensor, Tensor> {
        val start = if (layers.getValue(layer).type == "full_attention") 0 else maxOf(0, pos - manifest.slidingPast)
        return slice(layer, start, pos)
    }

    /** Writes a call's T new entries ([1, h, T, d] each) at positions pos..pos+T-1. */
    fun write(layer: Int, pos: Int, kNew: Tensor, vNew: Tensor) {
        val d = layers.getValue(layer)
        val count = kNew.shape[2].toInt()
        for (h in 0 until d.kvHeads) {
            val src = h * count * d.headDim
            val dst = (h * capacity + pos) * d.headDim
            kNew.floats!!.copyInto(keys.getValue(layer), dst, src, src + count * d.headDim)
            vNew.floats!!.copyInto(values.getValue(layer), dst, src, src + count * d.headDim)
        }
    }

    fun checkRoom(pos: Int, count: Int) {
        if (pos + count > capacity) {
            throw IllegalStateException("KV cache full: ${pos + count} positions needed, export capacity is $capacity; " +
                "shorten the prompt or max new tokens, or re-export with a larger --max-cache-len")
        }
    }

    /**
     * The clean hand-off (runtime/handoff.py, mode clean): the drafter sees only committed positions < pos;
     * its full-attention store layer all of them, its sliding one the last W+1.
     */
    fun drafterView(pos: Int): DrafterView = manifest.drafterLayers.mapValues { (type, layer) ->
        val lo = if (type == "full_attention") 0 else maxOf(0, pos - manifest.drafterSlidingVisible)
        slice(layer, lo, pos)
    }

    /** Positions [lo, hi) of one layer as [1, h, hi-lo, d] tensors (copies: the buffers keep changing). */
    private fun slice(layer: Int, lo: Int, hi: Int): Pair<Tensor, Tensor> {
        val d = layers.getValue(layer)
        val len = hi - lo
        val shape = longArrayOf(1, d.kvHeads.toLong(), len.toLong(), d.headDim.toLong())
        fun copy(buf: FloatArray): Tensor {
            val out = FloatArray(d.kvHeads * len * d.headDim)
            for (h in 0 until d.kvHeads) {
                val src = (h * capacity + lo) * d.headDim
                buf.copyInto(out, h * len * d.headDim, src, src + len * d.headDim)
            }
            return Tensor.of(shape, out)
        }
        return copy(keys.getValue(layer)) to copy(values.getValue(layer))
    }
}
