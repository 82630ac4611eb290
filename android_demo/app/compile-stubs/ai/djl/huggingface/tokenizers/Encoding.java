// Compile-only declaration (android_demo/test.sh's classpath, never packaged). Mirrors deepjavalibrary/djl v0.30.0
// extensions/tokenizers/src/main/java/ai/djl/huggingface/tokenizers/Encoding.java: getIds, the one member the app
// reads.
package ai.djl.huggingface.tokenizers;

public class Encoding {
    protected Encoding() {}

    public long[] getIds() {
        throw new UnsupportedOperationException("compile-only declaration");
    }
}
