package mtpkit.demo

import android.app.Activity
import android.content.Intent
import android.net.Uri
import android.os.Bundle
import android.provider.DocumentsContract
import android.view.View
import android.widget.Button
import android.widget.CheckBox
import android.widget.EditText
import android.widget.RadioGroup
import android.widget.TextView
import kotlinx.coroutines.runBlocking
import mtpkit.core.GenConfig
import mtpkit.core.Stats
import java.io.File
import kotlin.concurrent.thread

/**
 * One screen: prompt, backend (ONNX export through core's loop, or model.litertlm through LiteRT-LM), drafter
 * on/off, streamed output and live stats. Models come from `adb push DIR <external files>/model` or a folder
 * picked from storage (copied into app storage, since both runtimes need file paths).
 */
class MainActivity : Activity() {
    private val modelDir by lazy { File(getExternalFilesDir(null), "model") }
    private var onnx: OnnxRunner? = null
    private var litertlm: LiteRtLmRunner? = null

    override fun onCreate(savedInstanceState: Bundle?) {
        super.onCreate(savedInstanceState)
        setContentView(R.layout.activity_main)
        view<TextView>(R.id.model).text = getString(R.string.model_hint) + "\nusing: $modelDir"
        view<Button>(R.id.pick).setOnClickListener {
            startActivityForResult(Intent(Intent.ACTION_OPEN_DOCUMENT_TREE), PICK_FOLDER)
        }
        view<Button>(R.id.generate).setOnClickListener { generate() }
    }

    @Deprecated("framework Activity API; no androidx dependency in this demo")
    override fun onActivityResult(requestCode: Int, resultCode: Int, data: Intent?) {
        super.onActivityResult(requestCode, resultCode, data)
        val tree = data?.data ?: return
        if (requestCode != PICK_FOLDER || resultCode != RESULT_OK) return
        status("copying model files...")
        thread { copyTree(tree); closeRunners(); status("copied into $modelDir") }
    }

    private fun generate() {
        val prompt = view<EditText>(R.id.prompt).text.toString()
        val speculative = view<CheckBox>(R.id.speculative).isChecked
        val useOnnx = view<RadioGroup>(R.id.backend).checkedRadioButtonId == R.id.backend_onnx
        thread {
            try {
                if (useOnnx) generateOnnx(prompt, speculative) else generateLiteRtLm(prompt, speculative)
            } catch (e: Exception) {
                status("error: ${e.message}")
            }
        }
    }

    private fun generateOnnx(prompt: String, speculative: Boolean) {
        val runner = onnx ?: OnnxRunner(modelDir).also { onnx = it }
        val stats = Stats()
        runner.generate(prompt, GenConfig(maxNewTokens = 128, mtp = speculative), stats) { text ->
            show(text, onnxStats(stats))
        }
    }

    private fun onnxStats(s: Stats): String {
        val byPosition = s.acceptanceByPosition.joinToString(" ") { "%.0f%%".format(100 * it) }
        return "%d tokens, %.1f tok/s, drafter ran: %s (%d calls)\naccepted %d/%d (%s), by position [%s]\n%.2f tokens per target call"
            .format(s.newTokens, s.tokensPerSecond ?: 0.0, if (s.drafterRan) "yes" else "NO", s.drafterCalls,
                s.accepted, s.drafted, s.acceptanceRate?.let { "%.0f%%".format(100 * it) } ?: "-", byPosition,
                s.tokensPerTargetCall ?: 0.0)
    }

    private fun generateLiteRtLm(prompt: String, speculative: Boolean) {
        val file = modelDir.listFiles()?.firstOrNull { it.name.endsWith(".litertlm") }
            ?: error("no .litertlm file in $modelDir")
        val runner = litertlm ?: LiteRtLmRunner(file.path).also { litertlm = it }
        val header = "drafter in bundle: ${if (runner.hasDrafter) "yes" else "NO"}, speculation requested: $speculative"
        val info = runBlocking { runner.generate(prompt, speculative) { text -> show(text, header) } }
        status("$header\ndecode %.1f tok/s (%d tokens), ttft %.2f s; toggle the drafter and compare"
            .format(info.lastDecodeTokensPerSecond, info.lastDecodeTokenCount, info.timeToFirstTokenInSecond))
    }

    /** Copies the picked folder's files into modelDir (flat: an export folder has no subfolders). */
    private fun copyTree(tree: Uri) {
        modelDir.mkdirs()
        val children = DocumentsContract.buildChildDocumentsUriUsingTree(tree, DocumentsContract.getTreeDocumentId(tree))
        val columns = arrayOf(DocumentsContract.Document.COLUMN_DOCUMENT_ID, DocumentsContract.Document.COLUMN_DISPLAY_NAME)
        contentResolver.query(children, columns, null, null, null)?.use { c ->
            while (c.moveToNext()) {
                val uri = DocumentsContract.buildDocumentUriUsingTree(tree, c.getString(0))
                contentResolver.openInputStream(uri)?.use { input ->
                    File(modelDir, c.getString(1)).outputStream().use { input.copyTo(it) }
                }
            }
        }
    }

    private fun closeRunners() {
        onnx?.close().also { onnx = null }
        litertlm?.close().also { litertlm = null }
    }

    private fun show(text: String, stats: String) = runOnUiThread {
        view<TextView>(R.id.output).text = text
        view<TextView>(R.id.stats).text = stats
    }

    private fun status(message: String) = runOnUiThread { view<TextView>(R.id.stats).text = message }

    /** findViewById with the cast written out: its generic form is API 26, and test.sh compiles against API 23. */
    private inline fun <reified T : View> view(id: Int): T = findViewById(id) as T

    override fun onDestroy() {
        closeRunners()
        super.onDestroy()
    }

    private companion object {
        const val PICK_FOLDER = 1
    }
}
